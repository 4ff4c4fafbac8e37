"""An embedded Ray leaves no process behind when its driver dies, however it dies (issue 19, item 18).

The real CLI runs a small search with a private Ray temp dir (`RAY_TMPDIR`, which Ray takes as the root of its
session folders: `get_user_temp_dir` in ray/_common/utils.py); the driver is killed once Ray's processes are up,
and every process of that Ray instance must be gone within a bounded time. A process belongs to the instance when
its command line names the private temp dir or it holds a file open below it: Ray rewrites the command line of
its agents and workers (`ray::DashboardAgent`, `ray::ScoringWorker.score`), and even their environment block can be
overwritten by the new title, but each of them keeps its log files, in the session's folder, open.

The guardian itself (`longrope.workers.ray_guardian`) is also tested without Ray, on a driver that starts a
process tree: fast, and it shows what the guardian must never touch.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LONGROPE = Path(sys.executable).parent / "longrope"
CONFIG = REPO / "configs" / "demo.yaml"
LONG = [  # few windows, but more generations than the test waits for: the driver is always killed mid-search
    "data.search_windows=2",
    "search.generations=200",
    "search.early_stop.patience=200",
]
UP_TIMEOUT_S = 120.0  # until the workers run; ray.init alone takes ~3 s on 2 cores
GONE_TIMEOUT_S = 60.0  # without the guardian, the agents outlive the driver by ~60 s (and more on a busy box)


def below(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def session_processes(temp_dir: str) -> dict[int, str]:
    """pid -> command line of every live process (zombies left out) that names `temp_dir` on its command line or
    holds a file open below it."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        proc = Path("/proc", entry)
        try:
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            links = []
            for fd in os.listdir(proc / "fd"):
                with contextlib.suppress(OSError):
                    links.append(os.readlink(proc / "fd" / fd))
        except OSError:  # gone meanwhile
            continue
        if temp_dir in command or any(below(link, temp_dir) for link in links):
            found[int(entry)] = command[:80]
    return found


def wait_for(condition, timeout_s: float, interval_s: float = 0.5):
    """Polls `condition()` until it returns something true or the time is up; returns its last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)


def still_alive(temp_dir: str, timeout_s: float) -> dict[int, str]:
    """The processes of `temp_dir` still alive once they are all gone or the time is up."""
    wait_for(lambda: not session_processes(temp_dir), timeout_s)
    return session_processes(temp_dir)


def kill_all(pids) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def ray_temp_dir():
    path = tempfile.mkdtemp(prefix="lrk-", dir="/tmp")  # short: Ray's socket paths are length-limited
    yield path
    kill_all(session_processes(path))  # a failing test leaves nothing behind either
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_an_embedded_ray_dies_with_its_driver(tmp_path, ray_temp_dir, how):
    env = {**os.environ, "RAY_TMPDIR": ray_temp_dir, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    command = [str(LONGROPE), "search", str(CONFIG), "--no-progress", "--set", f"output_dir={tmp_path / 'run'}"]
    for override in LONG:
        command += ["--set", override]
    log = tmp_path / "driver.log"
    with log.open("w") as out:
        driver = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:

        def workers_up() -> dict[int, str]:
            found = session_processes(ray_temp_dir)
            names = " ".join(found.values())
            return found if "Agent" in names and "ScoringWorker" in names else {}

        before = wait_for(workers_up, UP_TIMEOUT_S)
        assert driver.poll() is None, f"the search ended before it was killed:\n{log.read_text()[-3000:]}"
        assert before, f"no Ray agents and workers under {ray_temp_dir}:\n{log.read_text()[-3000:]}"
        driver.send_signal(how)
        driver.wait(timeout=GONE_TIMEOUT_S)
        left = still_alive(ray_temp_dir, GONE_TIMEOUT_S)
        assert not left, f"{len(left)} of {len(before)} alive {GONE_TIMEOUT_S:g} s after the driver: {left}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            driver.kill()
        driver.wait()
