"""A cheap known objective for search tests: no model, the optimum is a known factor vector."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from longrope.encodings import LongRope, NtkRope, YarnRope
from longrope.search.coordinator import SearchProblem
from longrope.search.evolution import Seed
from longrope.workers.scorer import CandidateScore

HEAD_DIM, PAIRS, ORIGINAL, TARGET = 32, 16, 64, 256
OPTIMUM = np.round(1.0 + 3.6 * np.linspace(0.0, 1.0, PAIRS) ** 1.5, 2)  # inside the bound [1, 1.25 x 4]


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


def objective(factors: np.ndarray) -> float:
    return float(np.mean((np.log(factors) - np.log(OPTIMUM)) ** 2))


def make_candidate(factors, attention_factor=None, n_hat=0) -> LongRope:
    return LongRope.from_factors(
        torch.as_tensor(factors),
        head_dim=HEAD_DIM,
        original_length=ORIGINAL,
        target_length=TARGET,
        attention_factor=attention_factor,
        n_hat=n_hat,
    )


def problem() -> SearchProblem:
    shape = {"head_dim": HEAD_DIM, "max_position_embeddings": TARGET}
    seeds = [
        Seed("pi", np.full(PAIRS, 4.0)),
        Seed("ntk", NtkRope(factor=4.0, **shape).factors().double().numpy()),
        Seed(
            "yarn", YarnRope(factor=4.0, original_max_position_embeddings=ORIGINAL, **shape).factors().double().numpy()
        ),
    ]
    return SearchProblem(pairs=PAIRS, scale=4.0, seeds=seeds, make_candidate=make_candidate)


def finished_run(run_dir: Path) -> Path:
    """A finished run directory (cheap objective, no model, one generation) for the commands that read one."""
    from longrope.search.coordinator import Coordinator
    from longrope.search.job_config import load_job_config
    from longrope.search.run_store import RunDir

    config = load_job_config(None, ["target_length=256", "search.generations=1", f"output_dir={run_dir}"])
    RunDir(run_dir).create(config)
    Coordinator(config.search, problem(), RunDir(run_dir), FunctionEvaluator(), show_progress=False).run()
    return run_dir


class FunctionEvaluator:
    """In-process evaluator with the pool's shape; returns results in reverse order, as a pool may."""

    def __init__(self, fail_on_call: int | None = None):
        self.pending: list = []
        self.calls = 0
        self.evaluated = 0
        self.fail_on_call = fail_on_call

    def submit(self, candidates):
        self.pending.extend(candidates)

    def as_completed(self):
        self.calls += 1
        if self.fail_on_call is not None and self.calls == self.fail_on_call:
            first = self.pending.pop()
            yield first[0], self._score(first[1])
            raise RuntimeError("simulated coordinator crash in the middle of a generation")
        while self.pending:
            key, candidate = self.pending.pop()
            yield key, self._score(candidate)

    def _score(self, candidate: LongRope) -> CandidateScore:
        self.evaluated += 1
        return CandidateScore(nll=(objective(np.asarray(candidate.long_factor)),), tokens=(1,))
