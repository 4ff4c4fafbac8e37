"""What the search tests share beyond the known problem itself (bench/known_problem.py: a cheap
objective, no model, the optimum a known factor vector): an in-process evaluator of it, a coordinator built as
`longrope search` builds one, a finished run directory, and job.json as a model run of the problem's shape writes it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from known_problem import HEAD_DIM, ORIGINAL, TARGET, problem, window_nll, window_nll_gradient

from longrope.encodings import LongRope
from longrope.search.run.coordinator import SearchProblem
from longrope.workers.scorer import CandidateScore

# job.json as a model run of this problem's shape would have written it (export reads it)
JOB_RECORD = {
    "model_dir": "m",
    "original_length": ORIGINAL,
    "target_length": TARGET,
    "rope_theta": 10000.0,
    "head_dim": HEAD_DIM,
    "partial_rotary_factor": 1.0,
    "search_windows_hash": "h",
    "search_windows": {"count": 1, "tokens": TARGET + 1},
}


def unloadable_safetensors() -> bytes:
    """A model.safetensors that the driver's check finds whole (a JSON header whose tensors end where the file
    does, `safetensors_check.check_weights`) but of a dtype safetensors does not know, so only loading it fails:
    how a test reaches a worker's own load error."""
    header = json.dumps({"w": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}}).encode()
    return len(header).to_bytes(8, "little") + header + bytes(4)


@dataclass(frozen=True)
class ScoreWithGradient:
    """CandidateScore's shape with per-window gradients (d nll_j / d factors, then d / d attention factor)."""

    nll: tuple[float, ...]
    tokens: tuple[int, ...]
    gradient: tuple[tuple[float, ...], ...] | None = None
    misses: tuple[int, ...] | None = None


def known_problem_run(run_dir: Path, *overrides: str, **job_changes) -> Path:
    """A finished run directory (cheap objective, no model, one generation) for the commands that read one, with
    its job.json as `longrope search` writes it; `overrides` go to its config, `job_changes` to its job.json."""
    from longrope.search.optimizers.factory import load_job_config
    from longrope.search.run.run_store import RunDir

    settings = ["target_length=256", "search.generations=1", "data.search_windows=1", f"output_dir={run_dir}"]
    config = load_job_config(None, [*settings, *overrides])
    RunDir(run_dir).create(config)
    write_job_record(run_dir, config, **job_changes)
    make_coordinator(config, RunDir(run_dir), FunctionEvaluator()).run()
    return run_dir


def write_job_record(run_dir: Path, config, **changes) -> None:
    """job.json as `longrope search` writes it for this problem's shape (JOB_RECORD), sealed with its hash and
    the config's."""
    import json

    from longrope.search.run.job_record import JobRecord

    record = JobRecord.model_validate({**JOB_RECORD, "config_hash": config.hash(), **changes})
    (Path(run_dir) / "job.json").write_text(json.dumps(record.sealed()))


def run_job(config, run_dir, evaluator, *, resume: bool = False):
    """Start (or resume) `config`'s search in `run_dir` with `evaluator`; returns (best record, coordinator)."""
    if not resume:
        run_dir.create(config)
    coordinator = make_coordinator(config, run_dir, evaluator, resume=resume)
    return coordinator.run(), coordinator


def make_coordinator(
    config, run_dir, evaluator, search_problem: SearchProblem | None = None, *, resume: bool = False, **options
):
    """A quiet coordinator for `config` with its searcher built as `longrope search` builds it, complete: with
    `resume`, the run directory's history and state loaded first (`restore`); `options` go to the Coordinator (a
    watcher, a backward_cost)."""
    from longrope.search.run.coordinator import Coordinator

    search_problem = search_problem or problem(getattr(evaluator, "windows", 1))
    searcher = built_searcher(config, search_problem)
    if resume:
        history, state, outstanding = restore(run_dir, searcher)
        options |= {"history": history.records, "state": state, "outstanding": outstanding.candidates}
        options |= {"outstanding_asked": outstanding.asked}
    return Coordinator(config.search, search_problem, run_dir, evaluator, searcher, **options)


def restore(run_dir, searcher):
    """What a resumed run starts from: history.jsonl as read, state.json, and `searcher` brought to where the run
    stood (`replay.rebuild`, as `jobs` does for `--resume` after `read_run` has checked the files). Writes nothing."""
    from longrope.search.run.replay import rebuild

    history = run_dir.load_history()
    state = run_dir.read_state()
    outstanding = rebuild(run_dir, searcher, state, history)
    return history, state, outstanding


def built_searcher(config, search_problem: SearchProblem):
    """`config`'s searcher on the known problem, built as `longrope search` builds it."""
    from longrope.search.optimizers.factory import make_searcher

    return make_searcher(
        config.search,
        pairs=search_problem.pairs,
        scale=search_problem.scale,
        seeds=search_problem.seeds,
        mix=search_problem.mix,
    )


def replayed_state(config, run_dir, windows: int = 1) -> dict:
    """The searcher's state as a resume rebuilds it (state.json keeps none of it): a fresh searcher told
    history.jsonl's results as it asks for them (`replay.replay`), as JSON."""
    from longrope.search.run.replay import replay

    searcher = built_searcher(config, problem(windows))
    replay(run_dir, searcher, run_dir.read_history())
    return searcher.state().model_dump(mode="json")


class FunctionEvaluator:
    """In-process evaluator with the pool's shape; returns results in reverse order, as a pool may."""

    def __init__(
        self,
        fail_on_call: int | None = None,
        windows: int = 1,
        capacity: int = 4,
        wobble: float = 0.002,
        workers: int = 1,
    ):
        self.pending: list = []
        self.calls = 0
        self.evaluated = 0  # candidate-window groups scored
        self.window_evaluations = 0
        self.fail_on_call = fail_on_call
        self.windows = windows
        self.capacity = capacity
        self.wobble = wobble
        self.backward_windows = 0
        self.width = workers  # a pool's workers: a generation smaller than this has its windows cut over them
        self.submitted: list[tuple[str, tuple[int, int], bool]] = []  # (candidate key, windows, gradient) as sent

    def submit(self, candidates, windows=None, gradient=False):
        self.submitted += [(key[0], windows or (0, self.windows), gradient) for key, _ in candidates]
        self.pending.extend((key, candidate, windows or (0, self.windows), gradient) for key, candidate in candidates)
        self.backward_windows += (windows[1] - windows[0] if windows else self.windows) if gradient else 0

    def as_completed(self):
        self.calls += 1
        if self.fail_on_call is not None and self.calls == self.fail_on_call:
            first = self.pending.pop()
            yield first[0], self._score(*first[1:])
            raise RuntimeError("simulated coordinator crash in the middle of a generation")
        while self.pending:
            key, candidate, windows, gradient = self.pending.pop()
            yield key, self._score(candidate, windows, gradient)

    def _score(self, candidate: LongRope, windows: tuple[int, int], gradient: bool = False):
        self.evaluated += 1
        self.window_evaluations += windows[1] - windows[0]
        factors = np.asarray(candidate.long_factor)
        nll = tuple(window_nll(factors, j, self.windows, self.wobble) for j in range(*windows))
        if not gradient:
            return CandidateScore(nll=nll, tokens=(1,) * len(nll))
        grads = tuple(tuple(window_nll_gradient(factors, j, self.windows, self.wobble)) for j in range(*windows))
        return ScoreWithGradient(nll=nll, tokens=(1,) * len(nll), gradient=grads)


def result_of(candidate, score: float):
    """The record a searcher is told for `candidate` scored `score` on one window (`optimize.scored_record`)."""
    from longrope.search.optimizers.optimize import scored_record

    return scored_record(candidate, score)
