"""Run directories for the corruption suite (tests/test_run_dir_checks.py) and the tests that share its runs: the
cheap search stopped, finished, or killed at a chosen evaluator call, for the GA, gradient and hybrid optimizers,
and small edits of their files."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from known_problem import TARGET, problem
from search_helpers import FunctionEvaluator, make_coordinator, write_job_record

from longrope.search.optimizers.factory import load_job_config
from longrope.search.run.run_store import RunDir

# ---- run directories ----


PAPER_SEEDS = "search.seeds=[pi, ntk, yarn]"  # not the default's tuned grids: the tests' counts are worked for three


def cheap_config(run_dir: Path, *overrides: str):
    """The cheap search of search_helpers (FunctionEvaluator: one window, 16 pairs, 64 -> 256 tokens), from the paper's
    three seeds (the tests' counts are worked for them)."""
    overrides = ["target_length=256", "data.search_windows=1", PAPER_SEEDS, f"output_dir={run_dir}", *overrides]
    return load_job_config(None, overrides)


def stopped_run(run_dir: Path) -> Path:
    """A run stopped by a worker error in generation 2 of 3: state.json, job.json and a history, not finished."""
    config = cheap_config(run_dir, "search.generations=3")
    RunDir(run_dir).create(config)
    write_job_record(run_dir, config)
    with pytest.raises(RuntimeError, match="simulated coordinator crash"):
        make_coordinator(config, RunDir(run_dir), FunctionEvaluator(fail_on_call=3)).run()
    return run_dir


# gradient and hybrid runs: 4 windows (2 for the gradient, 2 held out); calls of the evaluator: gradient, 1 the
# seeds, k + 1 step k, 7 the rounding; hybrid, 1-3 generations 0-2, 4-7 the polish's steps after generation 2, 8 its
# rounding (killed by a worker error after the first result of call k: `FunctionEvaluator.fail_on_call`)
GRADIENT = ("search.optimizer=gradient", "search.gradient.steps=5")
HYBRID = (
    "search.optimizer=hybrid",
    "search.population=8",
    "search.parents=4",
    "search.mutations=2",
    "search.crossovers=2",
    "search.generations=2",
    "search.gradient.polish_every=2",
    "search.gradient.polish_steps=4",
)


def descent_run(run_dir: Path, optimizer: tuple[str, ...], fail_on_call: int | None = None) -> Path:
    """A gradient or hybrid run of the cheap problem, finished, or killed on evaluator call `fail_on_call`."""
    config = cheap_config(run_dir, "data.search_windows=4", "search.seed=3", *optimizer)
    RunDir(run_dir).create(config)
    write_job_record(run_dir, config, search_windows={"count": 4, "tokens": TARGET + 1})
    evaluator = FunctionEvaluator(windows=4, wobble=0.0, fail_on_call=fail_on_call)
    coordinator = make_coordinator(config, RunDir(run_dir), evaluator, problem(4))
    if fail_on_call is None:
        coordinator.run()
        return run_dir
    with pytest.raises(RuntimeError, match="simulated coordinator crash"):
        coordinator.run()
    return run_dir


def mid_polish(run_dir: Path, *extra: str) -> Path:
    """A hybrid killed in its polish after generation 2 of 2: one of its 4 steps told (state.json's `polish`);
    `extra` overrides its config (the polish by Adam: search.gradient.polish_method=adam)."""
    return descent_run(run_dir, (*HYBRID, *extra), fail_on_call=5)


def step_lines(run: Path) -> list[int]:
    """The indexes of history.jsonl's descent steps (lines with a gradient)."""
    return [k for k, record in enumerate(lines(run / "history.jsonl")) if "gradient" in record]


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def append_line(path: Path, record: dict) -> None:
    with path.open("a") as history:
        history.write(json.dumps(record) + "\n")


def rewrite_line(path: Path, number: int, change: Callable[[dict], dict]) -> None:
    records = lines(path)
    records[number] = change(records[number])
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def edit_json(path: Path, change: Callable[[dict], dict]) -> None:
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def scored(record: dict, mean_nll: float) -> dict:
    """A record made self-consistent around another mean NLL (its one window's NLL and its perplexity agree)."""
    return {**record, "mean_nll": mean_nll, "perplexity": math.exp(mean_nll), "nll": [mean_nll * record["tokens"][0]]}


def set_field(document: dict, path: list[str], value) -> dict:
    """`document` with the field at `path` set to `value`."""
    inner = document
    for name in path[:-1]:
        inner = inner[name]
    inner[path[-1]] = value
    return document
