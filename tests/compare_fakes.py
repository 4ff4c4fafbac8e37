"""Worker pools for compare's tests, in this process and deterministic: a method's NLL per token depends only on
its name and the window set, so two runs agree and rows differ.

- FakePool stands in for ComparePool (no windows are scored, only cut);
- InProcessPool stands in for the Ray WorkerPool under the real ComparePool (its counting and progress run);
- RefusingPool fails if it is ever built: bad input must be refused before any window set is scored.

The fixtures that put them in place are `fake_pool`, `refusing_pool` and `in_process_pool` in conftest.py."""

from __future__ import annotations

import zlib

from longrope.search.reports.compare_scoring import no_progress
from longrope.workers.scorer import CandidateScore
from longrope.workers.scoring_worker import window_spans


def fake_score(name: str, set_name: tuple[str, int], count: int) -> CandidateScore:
    """`count` windows of `set_name`'s length: NLL per token 1 + crc32(name/set) mod 1000 / 1000, + 0.01 per window;
    a needle set misses every other window."""
    level = 1.0 + (zlib.crc32(f"{name}/{set_name}".encode()) % 1000) / 1000
    tokens = set_name[1]
    nll = tuple(tokens * (level + 0.01 * k) for k in range(count))
    misses = tuple(k % 2 for k in range(count)) if set_name[0] == "needle" else None
    return CandidateScore(nll=nll, tokens=(tokens,) * count, misses=misses)


class FakePool:
    """ComparePool's interface; counts the pools built."""

    built = 0

    def __init__(self, context, sets):
        FakePool.built += 1
        self.sets = sets

    def score(self, methods, set_names, progress=no_progress, phase="scored"):
        return self.score_sets({s: methods for s in set_names}, progress, phase)

    def score_sets(self, methods_by_set, progress=no_progress, phase="scored"):
        return {
            s: {name: fake_score(name, s, len(self.sets[s].names)) for name in methods}
            for s, methods in methods_by_set.items()
        }

    def shutdown(self):
        pass


class RefusingPool:
    def __init__(self, context, sets):
        raise AssertionError("bad input must be refused before any window set is scored")


class InProcessPool:
    """WorkerPool's interface (spans, submit, as_completed, shutdown) for ComparePool's keys, (set name, method)."""

    def __init__(self, model_spec, windows, pool_spec, loss_mask=None):
        self.sets = windows if isinstance(windows, list) else [windows]
        self.spans = window_spans(self.sets)
        self.pending: list = []

    def submit(self, candidates, windows=None, gradient=False):  # WorkerPool.submit's signature
        self.pending += [(key, windows) for key, _ in candidates]

    def as_completed(self):
        while self.pending:
            (set_name, name), (start, stop) = self.pending.pop()
            yield (set_name, name), fake_score(name, set_name, stop - start)

    def shutdown(self):
        pass
