"""A real Ray cluster started with the `ray` CLI (docs/gpu-cluster.md), on this machine's CPUs.

`ray start --head` with free local ports and its own --temp-dir, then that page's two ways in: `longrope search`
with `workers.address=auto` from a shell on the head node, and `ray job submit` to the dashboard's job server,
with `ray job stop` and `longrope search --resume` through the job server. Every run has the same config (the
demo at a small budget; `output_dir` and `workers` are not part of a run's identity), so every finished run
must reach the same best candidate.

The cluster is stopped by its process group and the processes below it, never by `ray stop`, which stops every
Ray process on the machine (other tests' embedded instances included).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv's ray and longrope
CONFIG = REPO / "configs" / "demo.yaml"
SMALL = [  # the demo at a budget that takes well under a minute on 2 cores
    "search.population=8",
    "search.parents=4",
    "search.mutations=2",
    "search.crossovers=2",
    "search.generations=2",
    "data.search_windows=2",
]
PORT_OPTIONS = (
    "--port",
    "--dashboard-port",
    "--ray-client-server-port",
    "--node-manager-port",
    "--object-manager-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--runtime-env-agent-port",
    "--metrics-export-port",
)
RUN_TIMEOUT_S = 300


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, process group, state) for every process on the machine, from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        state, ppid, pgid = stat.rsplit(")", 1)[1].split()[:3]
        table[int(entry)] = (int(ppid), int(pgid), state)
    return table


def cluster_processes(pgid: int, known: set[int]) -> set[int]:
    """The live processes of the cluster: its process group (what `ray start` left running) and every process
    below one of them or below one seen before (Ray's workers and the job drivers run in groups of their own)."""
    table = processes()
    found = {pid for pid, (_, group, _) in table.items() if group == pgid} | (known & table.keys())
    while True:
        children = {pid for pid, (ppid, _, _) in table.items() if ppid in found} - found
        if not children:
            break
        found |= children
    return {pid for pid in found if table[pid][2] != "Z"}


def stop_cluster(pgid: int) -> None:
    """SIGTERM to the cluster's processes (what `ray stop` sends), SIGKILL to any left after a grace period;
    fails if one survives."""
    known = cluster_processes(pgid, set())
    for sig, grace_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):  # gcs_server may ignore SIGTERM
        for pid in known:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            known = cluster_processes(pgid, known)
            if not known:
                return
            time.sleep(0.2)
    assert not known, f"cluster processes still alive: {sorted(known)}"


def run(args: list[str], env: dict[str, str], cwd: Path, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def explain(result: subprocess.CompletedProcess) -> str:
    command = " ".join(result.args)
    return f"{command}\nexit {result.returncode}\nstdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}"


@pytest.fixture(scope="module")
def ray_cli_head(tmp_path_factory):
    """A head node from `ray start --head` on free ports: 2 CPUs, the dashboard and its job server."""
    home = tmp_path_factory.mktemp("ray_cli")  # the cluster's working directory, so a job's too
    temp_dir = Path(tempfile.mkdtemp(prefix="lrc-", dir="/tmp"))  # short: Ray's socket paths are length-limited
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # as in an activated venv: jobs find longrope
        "RAY_AUTH_MODE": "disabled",  # a token left in ~/.ray by another Ray would otherwise turn on token auth
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    env.pop("RAY_ADDRESS", None)
    ports = dict(zip(PORT_OPTIONS, free_ports(len(PORT_OPTIONS)), strict=True))
    command = [
        str(BIN / "ray"),
        "start",
        "--head",
        *(f"{option}={port}" for option, port in ports.items()),
        "--dashboard-host=127.0.0.1",
        f"--temp-dir={temp_dir}",
        "--num-cpus=2",
        "--include-dashboard=true",
        "--disable-usage-stats",
    ]
    start = subprocess.Popen(
        command,
        env=env,
        cwd=home,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the cluster's processes share this group: the teardown stops exactly them
    )
    try:
        output, _ = start.communicate(timeout=180)
        assert start.returncode == 0, f"{' '.join(command)}\nexit {start.returncode}\n{output[-4000:]}"
        gcs_address = (temp_dir / "ray_current_cluster").read_text().strip()  # what "auto" finds on the head
        assert gcs_address.endswith(f":{ports['--port']}"), gcs_address
        yield SimpleNamespace(
            home=home,
            temp_dir=temp_dir,
            env=env,
            gcs_address=gcs_address,
            dashboard=f"http://127.0.0.1:{ports['--dashboard-port']}",
        )
    finally:
        if start.poll() is None:
            start.kill()
            start.wait()
        stop_cluster(start.pid)
        shutil.rmtree(temp_dir, ignore_errors=True)


def ray_cli(ray_cli_head, *args: str) -> subprocess.CompletedProcess:
    result = run([str(BIN / "ray"), *args], env=ray_cli_head.env, cwd=ray_cli_head.home)
    assert result.returncode == 0, explain(result)
    return result


def ray_list(ray_cli_head, kind: str, *filters: str) -> list[dict]:
    """`ray list jobs|actors` from the cluster's state API (drivers and submitted jobs alike), as JSON."""
    options = [f"--filter={item}" for item in filters]
    result = ray_cli(
        ray_cli_head, "list", kind, f"--address={ray_cli_head.dashboard}", "--format=json", "--detail", *options
    )
    return json.loads(result.stdout)


def job_status(ray_cli_head, submission_id: str) -> dict:
    [job] = ray_list(ray_cli_head, "jobs", f"submission_id={submission_id}")
    return job


def run_status(ray_cli_head, run_dir: Path) -> dict:
    """`longrope status RUN --json`."""
    result = run([str(BIN / "longrope"), "status", str(run_dir), "--json"], env=ray_cli_head.env, cwd=ray_cli_head.home)
    assert result.returncode == 0, explain(result)
    return json.loads(result.stdout)


def search_on_the_cluster(ray_cli_head, run_dir: Path) -> dict:
    """The status of a run that must be finished, with a best candidate that `longrope export` writes."""
    status = run_status(ray_cli_head, run_dir)
    assert status["finished"] is True, status
    assert status["generation"] == status["generations"] == 2, status  # generation 0, then 1 and 2: the last
    assert status["best_key"] and status["best_perplexity"] <= min(status["seed_perplexities"].values()), status
    factors = run_dir.parent / "factors.json"
    result = run(
        [str(BIN / "longrope"), "export", str(run_dir), "-o", str(factors)], env=ray_cli_head.env, cwd=ray_cli_head.home
    )
    assert result.returncode == 0, explain(result)
    rope = json.loads(factors.read_text())["rope_parameters"]
    assert rope["rope_type"] == "longrope" and rope["factor"] == 8.0, rope
    long_factor = rope["long_factor"]
    assert len(long_factor) == 16 and long_factor == sorted(long_factor) and long_factor[0] >= 1.0, rope
    return status


@pytest.fixture(scope="module")
def shell_run(ray_cli_head, tmp_path_factory):
    """`longrope search CONFIG --set workers.address=auto` from a shell on the head node."""
    run_dir = tmp_path_factory.mktemp("shell") / "run"
    env = {**ray_cli_head.env, "RAY_ADDRESS": ray_cli_head.gcs_address}
    overrides = [*SMALL, "workers.address=auto", f"output_dir={run_dir}"]
    command = [str(BIN / "longrope"), "search", str(CONFIG), "--no-progress"]
    command += [part for item in overrides for part in ("--set", item)]
    result = run(command, env=env, cwd=REPO)
    assert result.returncode == 0, explain(result)
    return run_dir, result


def test_search_from_the_head_node_scores_on_the_cluster(ray_cli_head, shell_run):
    run_dir, result = shell_run
    status = search_on_the_cluster(ray_cli_head, run_dir)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "best_perplexity": status["best_perplexity"],
        "key": status["best_key"],
    }
    # the search was a driver of this cluster, and its two workers were actors there (ended with it)
    [driver] = [job for job in ray_list(ray_cli_head, "jobs") if str(run_dir) in (job["entrypoint"] or "")]
    assert driver["type"] == "DRIVER" and driver["status"] == "SUCCEEDED", driver
    workers = ray_list(ray_cli_head, "actors", "class_name=ScoringWorker", f"job_id={driver['job_id']}")
    assert len(workers) == 2 and {actor["state"] for actor in workers} == {"DEAD"}, workers
    logs = ray_cli_head.temp_dir / "session_latest" / "logs"  # each worker's stdout and stderr, on its node
    for actor in workers:
        assert list(logs.glob(f"worker-*-{actor['pid']}.err")), sorted(logs.glob("worker-*"))


def test_job_submit_stop_and_resume(ray_cli_head, shell_run, tmp_path_factory):
    """`ray job submit -- longrope search`, `ray job stop` once the run directory exists (a run can be resumed
    from then on), then `ray job submit -- longrope search --resume DIR`, which ends where the shell run did."""
    run_dir = tmp_path_factory.mktemp("job") / "run"  # absolute: the job runs in the cluster's directory
    overrides = [*SMALL, "workers.address=auto", f"output_dir={run_dir}"]
    entrypoint = ["longrope", "search", str(CONFIG), "--no-progress"]
    entrypoint += [part for item in overrides for part in ("--set", item)]
    submit = ["job", "submit", f"--address={ray_cli_head.dashboard}"]
    ray_cli(ray_cli_head, *submit, "--submission-id=longrope-first", "--no-wait", "--", *entrypoint)

    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not (run_dir / "config.json").exists():
        status = job_status(ray_cli_head, "longrope-first")
        assert status["status"] in ("PENDING", "RUNNING"), status
        assert time.monotonic() < deadline, status
        time.sleep(0.5)
    ray_cli(ray_cli_head, "job", "stop", f"--address={ray_cli_head.dashboard}", "longrope-first")  # waits for the end
    stopped = job_status(ray_cli_head, "longrope-first")
    assert stopped["status"] == "STOPPED", stopped
    logs = ray_cli(ray_cli_head, "job", "logs", f"--address={ray_cli_head.dashboard}", "longrope-first").stdout
    assert f"longrope search --resume {run_dir}" in logs and "Traceback" not in logs, logs
    driver_log = ray_cli_head.temp_dir / "session_latest" / "logs" / "job-driver-longrope-first.log"
    assert f"longrope search --resume {run_dir}" in driver_log.read_text()  # the head node keeps a job's output
    assert run_status(ray_cli_head, run_dir)["finished"] is False

    resume = ["longrope", "search", "--resume", str(run_dir), "--set", "workers.address=auto", "--no-progress"]
    submitted = ray_cli(ray_cli_head, *submit, "--submission-id=longrope-resumed", "--", *resume)
    assert "succeeded" in submitted.stdout, explain(submitted)
    resumed = job_status(ray_cli_head, "longrope-resumed")
    assert resumed["status"] == "SUCCEEDED" and resumed["driver_exit_code"] in (0, None), resumed

    status = search_on_the_cluster(ray_cli_head, run_dir)
    shell_status = run_status(ray_cli_head, shell_run[0])
    assert (status["best_key"], status["best_perplexity"], status["evaluations"]) == (
        shell_status["best_key"],
        shell_status["best_perplexity"],
        shell_status["evaluations"],
    )
