"""`longrope status` tells a live run from a dead one, and says why a run stopped; the search's progress reads
well on a terminal (a bar with an ETA) and off one (one plain line per generation, from generation 0).

Everything runs on the cheap known objective (no model, no Ray) except the two CLI checks, which go through
`longrope search` with a worker that runs out of memory or never reached (a finished run's resume)."""

from __future__ import annotations

import io
import json
import math
import os
import re
import select
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from cli_checks import snapshot
from rich.console import Console
from run_dir_helpers import GRADIENT, HYBRID, cheap_config, descent_run, edit_json, mid_polish
from search_helpers import FunctionEvaluator, known_problem_run, make_coordinator, problem

from longrope.search.cli.reporter import ConsoleReporter
from longrope.search.optimizers.factory import load_job_config
from longrope.search.reports.status import KILLED, format_status, run_status
from longrope.search.run import heartbeat as heartbeats
from longrope.search.run.run_store import RunDir
from longrope.workers.errors import Terminated, WorkerPoolError

TESTS = Path(__file__).resolve().parent
HANG_GUARD_S = 120  # a hung subprocess fails the test instead of holding CI; no assertion is made on time
OOM = "worker 0: scoring failed: OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB"
RESUME = "resume with `longrope search --resume"


def job(run_dir: Path, *overrides: str):
    return load_job_config(None, ["target_length=256", "data.search_windows=1", f"output_dir={run_dir}", *overrides])


class FailingEvaluator(FunctionEvaluator):
    """Scores generation 0, then raises `error` when the next generation is collected (a worker's OOM, a
    Ctrl-C or SIGTERM arriving while the coordinator waits on the workers)."""

    def __init__(self, error: BaseException):
        super().__init__()
        self.error = error

    def as_completed(self):
        if self.calls >= 1:
            raise self.error
        yield from super().as_completed()


def stopped_run(run_dir: Path, error: BaseException, **coordinator_options):
    """A run stopped by `error` after generation 0; returns the exception the coordinator let through."""
    config = job(run_dir, "search.generations=4")
    store = RunDir(run_dir)
    store.create(config)
    coordinator = make_coordinator(config, store, FailingEvaluator(error))
    if coordinator_options:
        coordinator.heartbeat = heartbeats.HeartbeatWriter(store.file(heartbeats.HEARTBEAT), **coordinator_options)
    with pytest.raises(type(error)) as raised:
        coordinator.run()
    return raised.value


# ---- status of a live, a killed, another host's and a finished run ----


HOLDER = textwrap.dedent(
    """
    import sys, time
    sys.path[:0] = [{tests!r}, {bench!r}]  # pytest's pythonpath: the tests' helpers and bench/known_problem.py
    from search_helpers import FunctionEvaluator, make_coordinator
    from longrope.search.optimizers.factory import load_job_config
    from longrope.search.run.run_store import RunDir

    class Stalling(FunctionEvaluator):
        def as_completed(self):
            if self.calls >= 1:  # generation 0 is scored and recorded; then wait, as on a slow worker
                print("holding", flush=True)
                time.sleep(3600)
            yield from super().as_completed()

    run_dir = RunDir(sys.argv[1])
    config = load_job_config(
        None, ["target_length=256", "search.generations=4", "data.search_windows=1", f"output_dir={{run_dir.path}}"]
    )
    with run_dir.lock():
        run_dir.create(config)
        make_coordinator(config, run_dir, Stalling()).run()
    """
)


def wait_for_line(process: subprocess.Popen, expected: str) -> None:
    ready, _, _ = select.select([process.stdout], [], [], HANG_GUARD_S)
    assert ready, "hang guard"
    line = process.stdout.readline()
    assert line.strip() == expected, (line, process.stderr.read() if process.poll() is not None else "")


def test_status_says_running_while_a_process_holds_the_run_and_stopped_once_it_is_killed(tmp_path):
    """A live search: "running (pid N on HOST, ...)" with an ETA. SIGKILLed, its heartbeat still says running,
    but the lock is gone and the pid too: "stopped at ..." with the resume command and no ETA."""
    script = tmp_path / "holder.py"
    script.write_text(HOLDER.format(tests=str(TESTS), bench=str(TESTS.parent / "bench")))
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, str(script), str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for_line(process, "holding")
        status = run_status(RunDir(run_dir))
        assert status.state == "running" and status.pid == process.pid, status
        assert status.eta_seconds is not None
        text = format_status(status)
        assert f"running (pid {process.pid} on {heartbeats.this_host()}, last update " in text
        assert "ETA" in text and "stopped" not in text
    finally:
        process.kill()
        process.wait(timeout=HANG_GUARD_S)
    status = run_status(RunDir(run_dir))
    assert status.state == "stopped" and status.eta_seconds is None, status
    assert status.stop_reason == KILLED
    text = format_status(status)
    assert "stopped at " in text and f"{RESUME} {run_dir}`" in text
    assert "ETA" not in text and "running (" not in text


def test_status_of_another_hosts_run_goes_by_the_heartbeats_age(tmp_path):
    """From another machine the lock says nothing: a "running" heartbeat younger than the threshold is a live
    run, an older one a dead run (the clock and the threshold are passed in: no wall-clock in the test)."""
    stopped_run(tmp_path / "run", KeyboardInterrupt())
    store = RunDir(tmp_path / "run")
    beat = heartbeats.Heartbeat(state="running", pid=4242, host="gpu-node-7", started_at=1000.0, updated_at=1000.0)
    store.file(heartbeats.HEARTBEAT).write_text(beat.model_dump_json())

    live = run_status(store, now=1010.0, host="laptop", stale_after_s=60.0)
    assert live.state == "running" and live.eta_seconds is not None
    assert "running (pid 4242 on gpu-node-7, last update 10s ago), ETA" in format_status(live)

    dead = run_status(store, now=1061.0, host="laptop", stale_after_s=60.0)
    assert dead.state == "stopped" and dead.eta_seconds is None
    assert dead.stop_reason == KILLED and f"{RESUME} {store.path}`" in format_status(dead)


def test_a_finished_run_is_finished_and_the_heartbeat_leaves_the_search_files_alone(tmp_path):
    """A clean end is recorded as finished (no ETA, no "running"); two identical runs still write the same
    history.jsonl and optimizer state: the heartbeat's times reach neither."""
    first, second = known_problem_run(tmp_path / "a"), known_problem_run(tmp_path / "b")
    beat = heartbeats.read_heartbeat(first / heartbeats.HEARTBEAT)
    assert beat is not None and beat.state == "finished" and beat.pid == os.getpid() and beat.stop_reason is None
    status = run_status(RunDir(first))
    assert status.state == "finished" and status.eta_seconds is None
    text = format_status(status)
    assert "  finished" in text and "running (" not in text and "ETA" not in text
    assert (first / "history.jsonl").read_bytes() == (second / "history.jsonl").read_bytes()
    states = [json.loads((run / "state.json").read_text()) for run in (first, second)]
    for state in states:
        del state["generation_seconds"]  # the run's own timing, there before the heartbeat
    assert states[0] == states[1]


@pytest.mark.parametrize(
    ("error", "sigterm_seen", "reason"),
    [
        (KeyboardInterrupt(), False, "Ctrl-C"),
        (Terminated(), False, "SIGTERM"),
        (KeyboardInterrupt(), True, "SIGTERM"),  # Ray turns a SIGTERM raised in its waits into Ctrl-C
        (WorkerPoolError(OOM), False, f"WorkerPoolError: {OOM}"),
    ],
    ids=["ctrl-c", "sigterm", "sigterm-via-ray", "worker-oom"],
)
def test_why_a_run_stopped_is_recorded_and_shown(tmp_path, error, sigterm_seen, reason):
    stopped_run(tmp_path / "run", error, sigterm_seen=lambda: sigterm_seen)
    beat = heartbeats.read_heartbeat(tmp_path / "run" / heartbeats.HEARTBEAT)
    assert beat is not None and beat.state == "stopped" and beat.stop_reason == reason
    status = run_status(RunDir(tmp_path / "run"))
    assert status.state == "stopped" and status.stop_reason == reason and status.eta_seconds is None
    text = format_status(status)
    assert "stopped at " in text and f"({reason}); {RESUME} {tmp_path / 'run'}`" in text
    assert "ETA" not in text


# ---- a worker's out-of-memory through `longrope search`: one console line, and status ----


@pytest.mark.slow
def test_worker_oom_costs_its_candidates_each_one_console_line_and_a_failed_record(tmp_path, monkeypatch, capsys):
    """A real worker on a local Ray runs out of memory on every batch: its scoring asks torch's CPU allocator for
    1 PiB (on a GPU the same request is CUDA's OutOfMemoryError). Each candidate costs one console line naming the
    error, no traceback, and a `failed` record in history.jsonl with the error; with no candidate left scored the
    run ends with one error line."""
    import ray
    import torch

    from longrope.search.cli import main as cli
    from longrope.workers import pool
    from longrope.workers.scoring_worker import ScoringWorker

    class OutOfMemoryWorker(ScoringWorker):  # defined here, so Ray ships it to the worker by value
        def score(self, batch):
            torch.empty(1 << 50, dtype=torch.uint8)

    monkeypatch.setattr(pool, "ScoringWorker", OutOfMemoryWorker)
    config = {
        "target_length": 256,
        "output_dir": str(tmp_path / "run"),
        "data": {"search_windows": 2, "cache_dir": str(tmp_path / "cache")},
        "search": {"generations": 0, "population": 3, "parents": 2, "seeds": ["pi", "ntk", "yarn"]},
        "workers": {"num_workers": 1, "local_num_cpus": 1, "retries": 0},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(config))
    try:
        code = cli.main(["search", str(tmp_path / "job.yaml"), "--no-progress"])
    finally:
        ray.shutdown()
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    lines = [line for line in err.splitlines() if "can't allocate memory" in line and "failed after" in line]
    assert len(lines) == 3 and all("you tried to allocate 1125899906842624 bytes" in line for line in lines), err
    records = [json.loads(line) for line in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records] == ["failed"] * 3
    assert all("can't allocate memory" in r["error"] for r in records)


# ---- resuming a finished run starts no Ray ----


RESUMER = textwrap.dedent(
    """
    import json, sys
    from longrope.search.cli.main import main
    codes = [
        main(["search", "--resume", sys.argv[1]]),
        main(["search", "--resume", sys.argv[1], "--set", "workers.address=127.0.0.1:1"]),
    ]
    print(json.dumps({{"codes": codes, "ray_imported": "ray" in sys.modules}}))
    """
)


def test_resuming_a_finished_run_says_so_without_starting_ray(tmp_path):
    """Neither Ray nor a cluster is touched: `ray` is never imported, and a dead cluster address is not even
    tried (it would fail the resume with "nothing answers there")."""
    run_dir = known_problem_run(tmp_path / "run")
    before = snapshot(run_dir)
    result = subprocess.run(
        [sys.executable, "-c", RESUMER.format(), str(run_dir)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"codes": [0, 0], "ray_imported": False}, result.stderr
    assert result.stderr.count("finished already") == 2, result.stderr
    assert snapshot(run_dir) == before, "resuming a finished run writes nothing"


# ---- progress off a terminal and on one ----


def progress_run(run_dir: Path, console: Console, *overrides: str):
    config = job(run_dir, *overrides)
    store = RunDir(run_dir)
    store.create(config)
    coordinator = make_coordinator(config, store, FunctionEvaluator())
    coordinator.reporter = ConsoleReporter(console)
    coordinator.run()
    return coordinator


def test_piped_progress_is_one_plain_line_per_generation_from_generation_0(tmp_path):
    """Off a terminal: no bar and no ANSI code, a line at once, then one whole line per generation numbered
    from 0 (the initial population), with the search-split perplexity, new bests marked, and the early-stop
    countdown (a 0.5-nat minimum gain that nothing reaches: 1/3, 2/3, then 3/3 and the stop)."""
    out = io.StringIO()
    console = Console(file=out, width=80)
    assert not console.is_terminal
    progress_run(
        tmp_path / "run",
        console,
        "search.generations=5",
        "search.early_stop.patience=3",
        "search.early_stop.min_improvement=0.5",
    )
    text = out.getvalue()
    assert "\x1b" not in text and "━" not in text
    lines = text.splitlines()
    assert lines[0] == "search: scoring generation 0/5 (initial population), 0 evaluations done"
    generations = [line for line in lines if line.startswith("generation ")]
    assert [line.split()[1] for line in generations] == ["0/5", "1/5", "2/5", "3/5"]
    assert generations[0].startswith("generation 0/5 (initial population)  evaluations 64  best search ppl ")
    assert all("best search ppl" in line and line.endswith("eval/s)") for line in generations), "one whole line"
    assert "no gain >= 0.5 for 1/3 generations" in generations[1]
    assert "no gain >= 0.5 for 2/3 generations" in generations[2]
    assert "no gain >= 0.5 for 3/3 generations: early stop" in generations[3]
    assert not any("new best" in line for line in generations), "no gain counted: never beside the countdown"


def test_a_new_best_prints_a_perplexity_that_differs_from_the_last(tmp_path):
    """Without early stopping every lower best is marked "* new best", and its perplexity is printed with as many
    digits as it takes to differ from the line before (the search's small late gains vanish at 4 decimals)."""
    out = io.StringIO()
    progress_run(tmp_path / "run", Console(file=out, width=80), "search.generations=6")
    generations = [line for line in out.getvalue().splitlines() if line.startswith("generation ")]
    printed = [line.split("best search ppl ")[1].split()[0] for line in generations]
    marked = [k for k, line in enumerate(generations) if "* new best" in line]
    assert marked, "the cheap objective improves within 6 generations"
    for k in marked:
        assert printed[k] != printed[k - 1] and float(printed[k]) < float(printed[k - 1])
    assert "no gain" not in out.getvalue()


@pytest.mark.parametrize("width", [80, 200])
def test_terminal_progress_keeps_its_numbers_at_any_width(tmp_path, width):
    """The bar the search drew (its last frame in the terminal's output): the count of evaluations, the best
    perplexity and the ETA whole, at 80 columns too (the bar graphic shrinks, never the numbers)."""
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=True, color_system=None)
    coordinator = progress_run(tmp_path / "run", console, "search.generations=2")
    frames = [line for line in re.split(r"[\r\n]|\x1b\[[0-9;?]*[A-Za-z]", out.getvalue()) if line.startswith("search ")]
    last = frames[-1]
    expected = coordinator.searcher.budget
    assert f"{expected}/{expected}" in last
    assert re.search(r"\d+:\d\d:\d\d ETA (\d+:\d\d:\d\d|-:--:--)$", last.rstrip()), last
    assert "…" not in last and len(last.rstrip()) <= width
    best = min(r.perplexity for r in coordinator.history.values() if r.perplexity is not None)
    assert f"ppl {best:.4f}" in last
    assert "generation 0/2 (initial population)" in out.getvalue()


def test_a_small_gain_is_printed_with_the_digits_that_show_it():
    """exp(0.1) = 1.10517091..., exp(0.1 + 1e-7) = 1.10517102...: equal to 6 decimals, apart at 7."""
    from longrope.search.run.generation_log import perplexity_text

    assert perplexity_text(0.1, 0.1 + 1e-7) == "1.1051709"
    assert perplexity_text(0.1, 0.2) == "1.1052"  # a gain visible at 4 decimals keeps 4
    assert perplexity_text(0.1, 0.1) == "1.1052"  # no gain: nothing to show
    assert perplexity_text(0.1, math.inf) == "1.1052"  # generation 0 has nothing before it


# ---- gradient and hybrid runs: what their generations are, the polish, the ETA ----


def logged_lines(config, run_dir: Path, evaluator, *, resume: bool = False) -> list[str]:
    """The plain lines a coordinator of `config` logs (as when piped), resumed from `run_dir` or not."""
    console = Console(record=True, width=300, force_terminal=False)
    reporter = ConsoleReporter(console, show_progress=False)
    coordinator = make_coordinator(config, RunDir(run_dir), evaluator, problem(4), reporter=reporter, resume=resume)
    coordinator.run()
    return console.export_text().splitlines()


def test_a_resumed_polish_says_where_in_the_polish_it_goes_on(tmp_path):
    """Killed in the polish after generation 2 of 2 (step 1 of 4 told): the position is that polish's
    step 2/4, not "generation 3/2"; the coordinator's first line says so too (`jobs._resume` logs the same)."""
    run = mid_polish(tmp_path / "run")
    config = cheap_config(run, "data.search_windows=4", "search.seed=3", *HYBRID)
    evaluator = FunctionEvaluator(windows=4, wobble=0.0)
    coordinator = make_coordinator(config, RunDir(run), evaluator, problem(4), resume=True)
    assert coordinator.searcher.position() == "the polish after generation 2/2, step 2/4"
    lines = logged_lines(config, run, FunctionEvaluator(windows=4, wobble=0.0), resume=True)
    assert lines[0] == "search: scoring the polish after generation 2/2, step 2/4, 17 evaluations done"
    assert not any("generation 3/" in line for line in lines)


def test_polish_lines_say_which_best_they_give(tmp_path):
    """A polish step's line gives the polish's best and the run's, named, and which polish it is."""
    run = tmp_path / "run"
    config = cheap_config(run, "data.search_windows=4", "search.seed=3", *HYBRID)
    RunDir(run).create(config)
    lines = [line for line in logged_lines(config, run, FunctionEvaluator(windows=4, wobble=0.0)) if "polish" in line]
    steps = [re.search(r"polish best ppl ([\d.]+)  run best ppl ([\d.]+)", line) for line in lines[:4]]
    assert lines[0].startswith("polish after generation 2, step 1/4  polish best ppl"), lines
    assert all(steps) and all(float(run) <= float(polish) for polish, run in (m.groups() for m in steps))
    assert lines[4].startswith("polish after generation 2, its best rounded to the grid  polish best ppl")


def test_status_names_the_optimizer_and_a_polish_under_way(tmp_path):
    """A hybrid killed in its polish: status names the optimizer and the polish's steps done; JSON too."""
    store = RunDir(mid_polish(tmp_path / "run"))
    status = run_status(store)
    text = format_status(status)
    assert (
        "hybrid: generation 2/2 done (generation 0 is the initial population); the polish after generation 2: "
        "1/4 steps done, next step 2/4" in text
    )
    assert status.polish.model_dump() == {"after_generation": 2, "steps_done": 1, "steps": 4, "rounded": False}
    assert status.optimizer == "hybrid"


def test_a_gradient_run_says_what_its_generations_are(tmp_path):
    """steps=5 makes generations 0-6: the log and status say 0 is the seeds, 1-5 the steps and 6 the
    best point rounded to the grid."""
    run = tmp_path / "run"
    config = cheap_config(run, "data.search_windows=4", "search.seed=3", *GRADIENT)
    RunDir(run).create(config)
    lines = [line for line in logged_lines(config, run, FunctionEvaluator(windows=4, wobble=0.0)) if "/6" in line]
    assert lines[0].startswith("search: scoring generation 0/6 (the seeds)")
    assert lines[1].startswith("generation 0/6 (the seeds)  evaluations 3")
    assert lines[2].startswith("generation 1/6 (step 1/5)  evaluations 4")
    assert lines[-1].startswith("generation 6/6 (the best point rounded to the grid)")
    text = format_status(run_status(RunDir(run)))
    assert "gradient: generation 6/6 done (0 the seeds, 1-5 descent steps, 6 the best point rounded to the grid)" in (
        text
    )


def test_a_live_hybrid_s_eta_counts_the_polish_still_to_run(tmp_path):
    """A hybrid at generation 1 of 2, polishing (4 steps and the rounding) after generation 2: the ETA is
    one generation (60 s, the median past generation 0) and 5 polish steps, timed at a GA candidate's share of a
    generation (60 / 4 children) before any polish step is timed; once one is, at the polish steps' median."""
    run = descent_run(tmp_path / "run", HYBRID, fail_on_call=3)
    edit_json(run / "state.json", lambda s: {**s, "generation_seconds": [10.0, 60.0]})
    store = RunDir(run)
    beat = heartbeats.Heartbeat(state="running", pid=4242, host="gpu-node-7", started_at=1000.0, updated_at=1000.0)
    store.file(heartbeats.HEARTBEAT).write_text(beat.model_dump_json())
    live = run_status(store, now=1010.0, host="laptop", stale_after_s=60.0)
    assert live.generation == 1 and live.eta_seconds == pytest.approx(60 + 5 * 15)
    assert "ETA 2.2 min" in format_status(live)
    edit_json(run / "state.json", lambda s: {**s, "polish_seconds": [30.0, 50.0]})
    live = run_status(store, now=1010.0, host="laptop", stale_after_s=60.0)
    assert live.eta_seconds == pytest.approx(60 + 5 * 40)
