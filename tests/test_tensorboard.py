"""TensorBoard scalars of a running search (`search.tensorboard: true`): read back from the event files
with TensorBoard's own EventAccumulator and compared with history.jsonl's bests worked out here; the search is
the same with them on or off (history.jsonl byte for byte); a resumed run writes no step twice and none out of
order; a job asking for them where the package is missing is refused before anything is written.

All on the cheap known objective (no model, no Ray).
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
from cli_checks import cli_error_line
from run_dir_helpers import stopped_run
from search_helpers import FunctionEvaluator, known_problem_run, make_coordinator, problem
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from longrope.search.cli.main import main
from longrope.search.job.jobs import _backward_cost, _Options
from longrope.search.optimizers.factory import load_job_config
from longrope.search.run.run_store import RunDir
from longrope.search.run.tensorboard_scalars import INSTALL, TENSORBOARD_DIR

TAGS = (
    "search/best_perplexity",
    "search/best_nll",
    "search/evaluations",
    "search/generation",
    "search/forward_windows",
    "search/backward_windows",
    "search/window_equivalents",
)
DEMO = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"
GA = ["search.population=16", "search.parents=8", "search.mutations=4", "search.crossovers=4", "search.generations=4"]


def job(run_dir: Path, *overrides: str, windows: int = 1):
    settings = ["target_length=256", f"data.search_windows={windows}", "search.seed=3", f"output_dir={run_dir}"]
    return load_job_config(None, [*settings, *GA, "search.tensorboard=true", *overrides])


def run(config, evaluator=None, *, resume: bool = False, windows: int = 1, **options):
    store = RunDir(config.output_dir)
    if not resume:
        store.create(config)
    evaluator = evaluator or FunctionEvaluator(windows=windows, wobble=0.0)
    coordinator = make_coordinator(config, store, evaluator, problem(windows), resume=resume, **options)
    return coordinator.run()


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in RUN/tensorboard/, as TensorBoard reads the folder (all its event files, in order)."""
    events = EventAccumulator(str(run_dir / TENSORBOARD_DIR))
    events.Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def f32(value: float) -> float:
    """What an event file keeps of a value: a 32-bit float."""
    return float(np.float32(value))


def history(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]


def test_the_scalars_are_the_history_s_bests_at_each_generation(tmp_path):
    """One step per generation, at the evaluations done then (16 for generation 0, then 8 more each); each value
    worked out from the history's first `step` lines (no racing: a line per candidate, each on every window)."""
    run(job(tmp_path))
    found, lines = scalars(tmp_path), history(tmp_path)
    assert set(found) == set(TAGS)
    steps = [16, 24, 32, 40, 48]
    for tag in TAGS:
        assert [step for step, _ in found[tag]] == steps, tag
    for generation, (step, _) in enumerate(found["search/evaluations"]):
        done = lines[:step]
        best = min(record["mean_nll"] for record in done)
        expected = {
            "search/best_nll": best,
            "search/best_perplexity": math.exp(best),
            "search/evaluations": step,
            "search/generation": generation,
            "search/forward_windows": sum(len(record["nll"]) for record in done),
            "search/backward_windows": 0,
            "search/window_equivalents": step,
        }
        for tag, value in expected.items():
            assert dict(found[tag])[step] == f32(value), (tag, step)


def test_a_descent_s_window_equivalents_count_its_backward_passes_at_c(tmp_path):
    """A gradient run: one step per descent step; window-equivalents = forward + c x backward windows, with the
    c the coordinator was given (the CLI gives `longrope estimate`'s)."""
    config = job(tmp_path, "search.optimizer=gradient", "search.gradient.steps=5", windows=4)
    run(config, windows=4, backward_cost=2.5)
    found, lines = scalars(tmp_path), history(tmp_path)
    assert found["search/backward_windows"][-1][1] > 0
    for step, value in found["search/window_equivalents"]:
        done = lines[:step]
        forward = sum(len(record["nll"]) for record in done)
        backward = sum(record.get("backward_windows", 0) for record in done)
        assert value == f32(forward + 2.5 * backward)
        assert dict(found["search/best_nll"])[step] == f32(min(record["mean_nll"] for record in done))


def test_without_a_c_a_descent_writes_no_window_equivalents(tmp_path):
    run(job(tmp_path, "search.optimizer=gradient", "search.gradient.steps=3", windows=4), windows=4)
    assert "search/window_equivalents" not in scalars(tmp_path)
    assert "search/backward_windows" in scalars(tmp_path)


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param([], id="generational"),
        pytest.param(["search.schedule=steady", "search.racing.enabled=true"], id="steady-racing"),
        pytest.param(["search.optimizer=hybrid", "search.gradient.polish_every=2", "search.gradient.polish_steps=2"]),
    ],
)
def test_the_search_is_the_same_with_tensorboard_on_or_off(tmp_path, overrides):
    windows = 4
    for flag in ("true", "false"):
        config = job(tmp_path / flag, *overrides, f"search.tensorboard={flag}", windows=windows)
        run(config, windows=windows, backward_cost=2.0)
    on, off = tmp_path / "true", tmp_path / "false"
    assert (on / "history.jsonl").read_bytes() == (off / "history.jsonl").read_bytes()
    state = [json.loads((folder / "state.json").read_text()) for folder in (on, off)]
    assert state[0]["optimizer"] == state[1]["optimizer"] and state[0]["progress"] == state[1]["progress"]
    assert (on / TENSORBOARD_DIR).is_dir() and not (off / TENSORBOARD_DIR).exists()
    assert RunDir(on).read_config().hash() == RunDir(off).read_config().hash(), "not part of the run's identity"


@pytest.mark.parametrize("fail_on_call", [2, 4])
def test_a_resumed_run_writes_each_step_once_and_in_order(tmp_path, fail_on_call):
    """Killed in a generation, resumed: TensorBoard reads the two event files as one run whose scalars are the
    uninterrupted run's, step for step."""
    clean = job(tmp_path / "clean")
    run(clean)
    crashed = job(tmp_path / "crash")
    with pytest.raises(RuntimeError, match="simulated coordinator crash"):
        run(crashed, FunctionEvaluator(fail_on_call=fail_on_call, wobble=0.0))
    run(crashed, resume=True)
    assert len(list((tmp_path / "crash" / TENSORBOARD_DIR).glob("events.out.tfevents.*"))) == 2
    assert scalars(tmp_path / "crash") == scalars(tmp_path / "clean")


def test_a_generation_gone_through_again_is_not_written_twice(tmp_path):
    """Killed after a generation's scalars were written but before state.json was (here: state.json removed
    from a finished run), the resumed run replays every generation from history.jsonl: it writes nothing again."""
    run(job(tmp_path))
    before = scalars(tmp_path)
    (tmp_path / "state.json").unlink()
    run(job(tmp_path), resume=True)
    assert scalars(tmp_path) == before


def test_the_cli_refuses_tensorboard_without_the_package(tmp_path, capsys, caplog, monkeypatch):
    """One line naming search.tensorboard and how to install it, before any run directory is made."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else find_spec(name, *a)
    )
    output = f"output_dir={tmp_path / 'run'}"
    argv = ["search", str(DEMO), "--set", output, "--set", "search.tensorboard=true"]
    line = cli_error_line(argv, capsys, caplog, folder=tmp_path)
    assert line.startswith("longrope: error: search.tensorboard: true needs the tensorboard package")
    assert INSTALL in line
    assert main(["validate", "--offline", str(DEMO), "--set", "search.tensorboard=true", "--json"]) == 0
    checks = json.loads(capsys.readouterr().out)["checks"]
    assert {"what": "search.tensorboard", "result": "skipped"}.items() <= checks[-1].items()


def test_a_resume_may_turn_tensorboard_on_and_nothing_else(tmp_path, capsys, caplog):
    run_dir = known_problem_run(tmp_path / "run")
    assert main(["search", "--resume", str(run_dir), "--set", "search.tensorboard=true"]) == 0
    line = cli_error_line(
        ["search", "--resume", str(run_dir), "--set", "search.seed=4"], capsys, caplog, folder=tmp_path
    )
    assert "can change only workers.* (where it is scored) and search.tensorboard" in line


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda folder: folder.write_text("x"), "tensorboard: not a folder; remove or rename it"),
        (lambda folder: folder.symlink_to("gone"), "tensorboard: a dangling symbolic link (to 'gone'); remove"),
    ],
    ids=["file", "dangling-link"],
)
def test_a_resume_refuses_a_tensorboard_that_is_no_folder_before_scoring(make, expected, tmp_path, capsys, caplog):
    """RUN/tensorboard a file or a dangling link, `--resume --set search.tensorboard=true`: one
    line naming it, before anything is scored (history.jsonl and heartbeat.json untouched: `cli_error_line`)."""
    run_dir = stopped_run(tmp_path / "run")
    make(run_dir / "tensorboard")
    argv = ["search", "--no-progress", "--resume", str(run_dir), "--set", "search.tensorboard=true"]
    assert expected in cli_error_line(argv, capsys, caplog, folder=tmp_path)


def test_c_is_priced_only_for_a_watched_run_with_backward_passes(tmp_path):
    """The CLI prices a backward pass (`longrope estimate`'s c for the job's model) only when search.tensorboard is
    on and the optimizer takes backward passes; a model it cannot price gives no c, and the search says in one
    warning line that it writes no window_equivalents."""
    from longrope.search.cli.estimate_command import job_backward_cost
    from longrope.search.cli.search_commands import _tensorboard_backward_cost

    demo = [f"output_dir={tmp_path}", "search.tensorboard=true"]
    gradient = load_job_config(DEMO, [*demo, "search.optimizer=gradient"])
    assert _tensorboard_backward_cost(load_job_config(DEMO, demo)) is None, "dim_mono: forward only"
    assert _tensorboard_backward_cost(load_job_config(DEMO, [*demo[:1], "search.optimizer=gradient"])) is None
    assert _tensorboard_backward_cost(gradient) == job_backward_cost(gradient)[0] > 1.0
    unpriced = gradient.model_copy(update={"model": gradient.model.model_copy(update={"path": str(tmp_path / "m")})})
    assert _tensorboard_backward_cost(unpriced) is None
    lines = []

    class Lines:
        def log(self, line):
            lines.append(line)

    assert _backward_cost(gradient, _Options(Lines(), lambda: False, None)) is None
    assert lines == [
        "search: warning: search.tensorboard: no search/window_equivalents scalar (no price for a backward pass)"
    ]
