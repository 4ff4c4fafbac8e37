"""Fault injection on the real `longrope search` (reference model, embedded Ray): SIGKILL at random points,
a torn history line, two writers at once, Ctrl-C and SIGTERM. Every interrupted run, resumed, must reach the
uninterrupted run's optimizer state and best, with no candidate scored twice and none that was scored lost."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

pytestmark = pytest.mark.slow
LONGROPE = shutil.which("longrope", path=str(Path(sys.executable).parent))
POPULATION = 8
# one candidate per call and per forward: each score is computed alone, so it is bit-identical however the
# interrupted runs happen to batch the work
CONFIG = {
    "name": "fault",
    "model": {"path": "reference", "device": "cpu"},
    "target_length": 1024,
    "data": {"search_windows": 4, "cache_dir": "cache"},
    "search": {
        "population": POPULATION,
        "parents": 4,
        "mutations": 3,
        "crossovers": 3,
        "generations": 3,
        "seed": 3,
        "seeds": ["pi", "ntk", "yarn"],  # the paper's three, not the tuned grids: the line counts are worked for them
        "attention_factor": {"mode": "searched"},
    },
    "workers": {"num_workers": 1, "candidates_per_forward": 1, "batch_size": 1, "local_num_cpus": 2},
}
TOTAL = POPULATION + 3 * (3 + 3)
HANG_GUARD_S = 600  # a hung run fails the test instead of holding CI; no assertion is made on time


@pytest.fixture(autouse=True)
def interruptible_children():
    """Children that take Ctrl-C as a terminal user's process does. A shell starts background jobs with SIGINT
    ignored (POSIX), exec keeps an ignored signal ignored, and Python then installs no KeyboardInterrupt handler:
    under `make test &` every SIGINT this module sends would be dropped. A handler in this process is reset to
    the default at exec, so each child starts with SIGINT at its default and Python's own handler."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def start(tmp_path: Path, *args: str) -> subprocess.Popen:
    """`longrope search` in a session of its own, so the test can kill it alone or with its process group."""
    return subprocess.Popen(
        [LONGROPE, "search", *args, "--no-progress"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(process: subprocess.Popen) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=HANG_GUARD_S)
    reap(process)
    return process.returncode, out, err


def reap(process: subprocess.Popen) -> None:
    """Stop what a killed coordinator left behind in its session (Ray's agents), so tests do not pile them up."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def history_lines(run_dir: Path) -> list[str]:
    path = run_dir / "history.jsonl"
    return path.read_bytes().decode().split("\n")[:-1] if path.exists() else []


def wait_for(process: subprocess.Popen, ready) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not ready():
        assert process.poll() is None, f"the run ended before the kill point: {process.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, "hang guard"
        time.sleep(0.02)


def write_config(folder: Path, output_dir: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "output_dir": output_dir}))
    return path


def saved_state(run_dir: Path) -> dict:
    """state.json less its timings: where the search stands and how it stopped (state.json keeps no searcher state
    but the steady GA's: a resume replays history.jsonl, whose lines the tests compare as well)."""
    state = json.loads((run_dir / "state.json").read_text())
    return {key: value for key, value in state.items() if not key.endswith("_seconds")}


def best_of_history(run_dir: Path) -> dict:
    records = [json.loads(line) for line in history_lines(run_dir)]
    return min(records, key=lambda r: (r["mean_nll"], r["key"]))


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("clean")
    write_config(folder, "run")
    code, _, err = finish(start(folder, "job.yaml"))
    assert code == 0, err[-3000:]
    assert len(history_lines(folder / "run")) == TOTAL
    return folder / "run"


def kill_points(seed: int) -> list[int]:
    """History lengths at which to kill: 0 (run directory made, nothing scored yet), two inside the initial
    population (before the first generation ends), and three drawn from the rest, increasing."""
    rng = np.random.default_rng(seed)
    early = sorted(rng.choice(np.arange(1, POPULATION), size=2, replace=False).tolist())
    late = sorted(rng.choice(np.arange(POPULATION, TOTAL - 1), size=3, replace=False).tolist())
    return [0, *early, *late]


def test_sigkill_at_six_points_then_resume_equals_the_uninterrupted_run(clean_run, tmp_path):
    write_config(tmp_path, "run")
    run_dir = tmp_path / "run"
    points = kill_points(seed=7)
    kept: dict[str, str] = {}  # every history line seen after a kill: none may be lost or changed
    for number, point in enumerate(points):
        process = start(tmp_path, "job.yaml") if number == 0 else start(tmp_path, "--resume", "run")
        if point == 0:
            wait_for(process, lambda: (run_dir / "job.json").exists())
        else:
            wait_for(process, lambda point=point: len(history_lines(run_dir)) >= point)
        if number == len(points) - 1:
            os.killpg(process.pid, signal.SIGKILL)  # the whole process group: coordinator and Ray at once
        else:
            process.send_signal(signal.SIGKILL)
        process.wait(timeout=HANG_GUARD_S)
        reap(process)
        for line in history_lines(run_dir):
            kept[json.loads(line)["key"]] = line
    code, _, err = finish(start(tmp_path, "--resume", "run"))
    assert code == 0, err[-3000:]
    lines = history_lines(run_dir)
    keys = [json.loads(line)["key"] for line in lines]
    assert len(keys) == len(set(keys)) == TOTAL, "no candidate scored twice"
    assert all(line in lines for line in kept.values()), "nothing scored before a kill is lost"
    assert saved_state(run_dir) == saved_state(clean_run)
    assert best_of_history(run_dir) == best_of_history(clean_run)
    assert set(keys) == {json.loads(line)["key"] for line in history_lines(clean_run)}


def test_torn_line_is_cut_with_one_warning_and_two_writers_never_run_at_once(clean_run, tmp_path):
    write_config(tmp_path, "run")
    run_dir = tmp_path / "run"
    process = start(tmp_path, "job.yaml")
    wait_for(process, lambda: len(history_lines(run_dir)) >= POPULATION + 2)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=HANG_GUARD_S)
    reap(process)
    *kept, last = history_lines(run_dir)
    # what a kill in the middle of the last write leaves: part of that line, no newline
    (run_dir / "history.jsonl").write_text("".join(line + "\n" for line in kept) + last[:57])
    first, second = start(tmp_path, "--resume", "run"), start(tmp_path, "--resume", "run")
    results = [finish(first), finish(second)]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], [err[-2000:] for _, _, err in results]
    (_, _, ran), (_, _, refused) = sorted(results, key=lambda result: result[0])
    refusal = [line for line in refused.splitlines() if line.strip()]
    assert len(refusal) == 1 and "is in use by another running `longrope search`" in refusal[0]
    assert ran.count("torn line") == 1, ran
    assert last in history_lines(run_dir), "the torn candidate was scored again, to the same record"
    keys = [json.loads(line)["key"] for line in history_lines(run_dir)]
    assert len(keys) == len(set(keys)) == TOTAL
    assert saved_state(run_dir) == saved_state(clean_run)
    assert best_of_history(run_dir) == best_of_history(clean_run)


def test_ctrl_c_then_sigterm_stop_cleanly_and_the_run_resumes(clean_run, tmp_path):
    """Ctrl-C on the first start, SIGTERM on the resume, then a resume to the end: each stop is one line with the
    resume command and exit 130 / 143, and the result is the uninterrupted run's."""
    write_config(tmp_path, "run")
    run_dir = tmp_path / "run"
    stops = [
        (("job.yaml",), 3, signal.SIGINT, 130, "Ctrl-C"),
        (("--resume", "run"), 12, signal.SIGTERM, 143, "SIGTERM"),
    ]
    for args, lines, signum, code, name in stops:
        process = start(tmp_path, *args)
        wait_for(process, lambda lines=lines: len(history_lines(run_dir)) >= lines)
        process.send_signal(signum)
        returncode, _, err = finish(process)
        assert returncode == code, err[-3000:]
        assert "Traceback" not in err
        assert err.strip().splitlines()[-1] == (
            f"longrope: stopped by {name}; every scored candidate is on disk, continue with: "
            "longrope search --resume run"
        )
    resumed, _, err = finish(start(tmp_path, "--resume", "run"))
    assert resumed == 0, err[-3000:]
    assert saved_state(run_dir) == saved_state(clean_run)
    keys = [json.loads(line)["key"] for line in history_lines(run_dir)]
    assert len(keys) == len(set(keys)) == TOTAL


def test_steady_racing_run_killed_at_three_points_loses_nothing_and_scores_nothing_twice(tmp_path):
    """Steady-state with racing (not bit-reproducible, so no clean run to equal): SIGKILL at three points, then a
    resume to the end; every candidate has exactly one final record, every line written before a kill is still
    there, and no window of any candidate was scored twice (each key's lines extend its windows strictly)."""
    steady = {**CONFIG["search"], "schedule": "steady", "racing": {"enabled": True, "z": 1.0, "min_windows": 2}}
    folder = tmp_path
    folder.mkdir(exist_ok=True)
    (folder / "job.yaml").write_text(yaml.safe_dump({**CONFIG, "search": steady, "output_dir": "run"}))
    run_dir = folder / "run"
    kept: list[str] = []
    for number, point in enumerate((3, POPULATION + 4, POPULATION + 12)):
        process = start(folder, "job.yaml") if number == 0 else start(folder, "--resume", "run")
        wait_for(process, lambda point=point: len(history_lines(run_dir)) >= point)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=HANG_GUARD_S)
        reap(process)
        kept = history_lines(run_dir)
    code, _, err = finish(start(folder, "--resume", "run"))
    assert code == 0, err[-3000:]
    lines = history_lines(run_dir)
    assert lines[: len(kept)] == kept, "nothing written before a kill is lost or changed"
    records = [json.loads(line) for line in lines]
    finals = [r for r in records if r["status"] != "partial"]
    assert len(finals) == len({r["key"] for r in finals}) == TOTAL
    windows_seen: dict[str, int] = {}
    for record in records:
        assert len(record["nll"]) > windows_seen.get(record["key"], 0), "a window scored twice"
        windows_seen[record["key"]] = len(record["nll"])
    state = json.loads((run_dir / "state.json").read_text())
    assert state["finished"] and state["optimizer"]["state"]["pending"] == []


def test_sigterm_that_ray_turns_into_a_plain_keyboard_interrupt_still_exits_143(monkeypatch, capsys):
    """Ray's core worker runs signal handlers inside `ray.get`/`ray.wait` and re-raises whatever they raise as a
    plain KeyboardInterrupt; the stop must still be reported as SIGTERM with exit 143 (seen in CI as 'Ctrl-C',
    130). The handler below does what Ray does with the handler's exception."""
    from longrope.search.cli import main as cli

    def ray_like_wait(args) -> int:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises during this call
        except KeyboardInterrupt:
            raise KeyboardInterrupt() from None
        return 0

    parser = argparse.ArgumentParser()
    parser.set_defaults(handler=ray_like_wait)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    assert cli.main([]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err.strip() == "longrope: stopped by SIGTERM"


# ---- gradient descent: killed at random points, resumed to the uninterrupted run ----

GRADIENT = {
    **CONFIG,
    "name": "fault-gradient",
    "search": {
        "optimizer": "gradient",
        "seed": 3,
        "seeds": ["pi", "ntk", "yarn"],
        "attention_factor": {"mode": "searched"},
        "gradient": {"steps": 5, "holdout_windows": 1, "patience": None},
    },
    "workers": {**CONFIG["workers"], "num_workers": 2, "local_num_cpus": 2, "num_cpus_per_worker": 0.5},
}
GRADIENT_LINES = 3 + 5 + 1  # the seeds, the steps, the best point rounded to the grid (unless scored already)


def clean_then_killed(config: dict, clean: Path, killed: Path, kill_points) -> int:
    """`config` run uninterrupted in `clean`, then in `killed` SIGKILLed at each of `kill_points(lines of the clean
    run)` (0: before anything is scored; k: once k history lines are written), resumed each time, and finished.
    Returns the clean run's line count."""
    for folder in (clean, killed):
        folder.mkdir()
        (folder / "job.yaml").write_text(yaml.safe_dump({**config, "output_dir": "run"}))
    code, _, err = finish(start(clean, "job.yaml"))
    assert code == 0, err[-3000:]
    total = len(history_lines(clean / "run"))
    for number, point in enumerate(kill_points(total)):
        process = start(killed, "job.yaml") if number == 0 else start(killed, "--resume", "run")
        if point == 0:
            wait_for(process, lambda: (killed / "run" / "job.json").exists())
        else:
            wait_for(process, lambda point=point: len(history_lines(killed / "run")) >= point)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=HANG_GUARD_S)
        reap(process)
    code, _, err = finish(start(killed, "--resume", "run"))
    assert code == 0, err[-3000:]
    return total


def test_a_gradient_run_killed_at_random_points_resumes_to_the_uninterrupted_run(tmp_path):
    """Two workers share each step's gradient windows (data-parallel); SIGKILL before anything is scored, among
    the seeds and among the steps (drawn with a fixed seed), then resume: the same state and history as a run
    never stopped, no point scored twice, and every step's line carries its gradient and backward windows."""
    rng = np.random.default_rng(11)
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    total = clean_then_killed(
        GRADIENT, clean, killed, lambda total: [0, int(rng.integers(1, 3)), int(rng.integers(4, total - 1))]
    )
    assert total <= GRADIENT_LINES
    lines = history_lines(killed / "run")
    keys = [json.loads(line)["key"] for line in lines]
    assert len(keys) == len(set(keys)), "no point scored twice"
    # the same lines (a generation's lines are in the order results arrived, which two workers may swap)
    assert sorted(lines) == sorted(history_lines(clean / "run")), "nothing lost, every line the uninterrupted one"
    assert saved_state(killed / "run") == saved_state(clean / "run")
    steps = [json.loads(line) for line in lines if "gradient" in json.loads(line)]
    assert steps and all(r["backward_windows"] == 3 and len(r["gradient"]) == 16 + 1 for r in steps)


SURROGATE = {**CONFIG, "search": {**CONFIG["search"], "surrogate": {"enabled": True, "proposals": 4}}}


def test_a_screened_run_killed_at_three_points_resumes_to_the_uninterrupted_run(tmp_path):
    """search.surrogate on (3 of each generation's 6 children scored, from 12 bred): SIGKILL before anything is
    scored, in generation 0, and in a screened generation, then resume: the same state (the generator and the
    screening counts included) and the same lines as a run never stopped, nothing scored twice."""
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    total = clean_then_killed(SURROGATE, clean, killed, lambda total: [0, POPULATION // 2, POPULATION + 4])
    assert total == POPULATION + 3 * 3
    lines = history_lines(killed / "run")
    keys = [json.loads(line)["key"] for line in lines]
    assert len(keys) == len(set(keys)), "no candidate scored twice"
    assert sorted(lines) == sorted(history_lines(clean / "run"))
    state = saved_state(killed / "run")
    assert state == saved_state(clean / "run")
    assert (state["progress"]["proposed"], state["progress"]["screened_out"]) == (3 * 12, 3 * 9)


def test_a_run_of_a_model_that_ships_rope_scaling_killed_and_resumed_equals_the_uninterrupted_run(tmp_path):
    """A tiny Llama with `llama3` scaling (pre-trained at 64 tokens, serving 256) searched for 1024: the start is
    its serving length and its own scaling a seed, read again from the model on every resume. SIGKILL before
    anything is scored, among the seeds and in the last generation, then resume: the same state and lines as a run
    never stopped, and job.json records the same serving length."""
    from family_models import byte_job, save_family_model

    model_dir = save_family_model("llama (llama3 scaling)", tmp_path / "model")
    documents = tmp_path / "docs"
    documents.mkdir()
    for index in range(6):
        (documents / f"{index}.txt").write_text(" ".join(f"w{index}{n % 97}" for n in range(500)))
    search = {"population": 6, "parents": 3, "mutations": 2, "crossovers": 2, "generations": 2, "seed": 5}
    workers = {"num_workers": 1, "num_cpus_per_worker": 1, "local_num_cpus": 2, "batch_size": 1}
    config = byte_job(model_dir, documents, 1024, name="shipped", search=search, workers=workers)
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    clean_then_killed(config, clean, killed, lambda total: [0, 2, total - 2])
    assert sorted(history_lines(killed / "run")) == sorted(history_lines(clean / "run"))
    assert saved_state(killed / "run") == saved_state(clean / "run")
    jobs = [json.loads((folder / "run" / "job.json").read_text()) for folder in (clean, killed)]
    assert jobs[0] == jobs[1] and jobs[0]["serving_length"] == 256
    records = [json.loads(line) for line in history_lines(clean / "run")]
    assert "own" in {r.get("seed") for r in records}, "the model's own scaling moved to the target is a seed"
    # generation 0: PI, NTK, YaRN, NTK at 1.5 and 2 times and YaRN at 1.5 times the scale (the coarse grids' other
    # points differ only in an attention factor this search does not search: one candidate each), and `own`;
    # 7 seeds, all kept though the population is 6
    first = [r["seed"] for r in records if r["generation"] == 0]
    assert len(first) == 7 > search["population"]
    assert {name.split(",")[0] for name in first} >= {"ntk_tuned (1.5", "ntk_tuned (2.0", "yarn_tuned (1.5"}
