"""An embedded Ray leaves no process behind when its driver dies, however it dies.

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
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from longrope.workers import ray_guardian
from longrope.workers.ray_guardian import guarded

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


# The guardian alone, on a driver that starts a tree of `sleep`s the way ray.init starts Ray's processes.
DRIVER = """
import json, subprocess, sys, time
from longrope.workers.ray_guardian import guarded

def sleeper(seconds):
    return subprocess.Popen(["sleep", str(seconds)]).pid

older = sleeper(300)  # started before the guardian: not Ray's
with guarded():  # as ray.init: a child ("raylet") that starts a child ("agent") now and another ("worker") later
    raylet = subprocess.Popen([sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '300']); "
                               "time.sleep(1.5); subprocess.Popen(['sleep', '300']); time.sleep(300)"])
    time.sleep(1.0)
later = sleeper(300)  # started by the driver after ray.init returned: not Ray's
time.sleep(1.5)
print(json.dumps({"older": older, "later": later, "raylet": raylet.pid}), flush=True)
time.sleep(300)
"""


def process_tree(root: int) -> set[int]:
    """`root` and its live descendants."""
    table = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            state, ppid = Path("/proc", entry, "stat").read_text().rsplit(")", 1)[1].split()[:2]
            if state != "Z":
                table[int(entry)] = int(ppid)
    tree, grown = {root} & table.keys(), True
    while grown:
        grown = {pid for pid, ppid in table.items() if ppid in tree} - tree
        tree |= grown
    return tree


def alive(pid: int) -> bool:
    return bool(process_tree(pid))


def test_the_guardian_stops_what_started_under_it_when_the_driver_is_killed():
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True)
    pids = {}
    try:
        pids = json.loads(driver.stdout.readline())
        ray_like = process_tree(pids["raylet"])
        assert len(ray_like) == 3, "the raylet stand-in, its agent and its late worker"
        driver.kill()
        driver.wait()
        wait_for(lambda: not any(map(alive, ray_like)), 10.0)
        assert not any(map(alive, ray_like)), "the guardian left processes of the instance alive"
        assert alive(pids["older"]) and alive(pids["later"]), "the guardian stopped processes that are not Ray's"
    finally:
        driver.kill()
        driver.wait()
        kill_all(pid for pid in pids.values())
        kill_all(process_tree(pids.get("raylet", 0)))


def test_the_guardian_goes_when_what_it_guards_is_gone():
    with guarded():
        child = subprocess.Popen(["sleep", "1"])
        time.sleep(0.5)
    guardian = ray_guardian._guardians[-1]
    child.wait()
    assert guardian.wait(timeout=10) == 0


@pytest.mark.parametrize("fails_after_s", [0.5, 0.0], ids=["after-a-poll", "before-the-first-poll"])
def test_a_failed_start_is_cleaned_up_at_once(fails_after_s):
    with pytest.raises(RuntimeError, match="init failed"), guarded():
        child = subprocess.Popen(["sleep", "300"])
        time.sleep(fails_after_s)
        raise RuntimeError("init failed")
    try:
        assert child.wait(timeout=10) == -signal.SIGTERM
    finally:
        child.kill()
