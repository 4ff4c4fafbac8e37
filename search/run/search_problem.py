"""What the coordinator is given: the search problem (pairs, scale, seeds, how a genome becomes a scored method),
the evaluator's shape (the Ray worker pool, or an in-process stand-in)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from longrope.encodings import RopeMethod
from longrope.search.optimizers.genome import Seed
from longrope.search.optimizers.objective import ObjectiveMix
from longrope.search.optimizers.searcher import WindowRange
from longrope.workers.scorer import CandidateScore


class Evaluator(Protocol):
    """What the coordinator needs of a worker pool (WorkerPool has exactly this shape)."""

    capacity: int  # candidates it scores at once (workers x calls in flight x batch): steady keeps this many out

    def submit(self, candidates: Iterable[tuple[Hashable, RopeMethod]], windows: WindowRange | None = None) -> None: ...

    def as_completed(self) -> Iterator[tuple[Hashable, CandidateScore]]: ...


@dataclass(frozen=True)
class SearchProblem:
    """The search space of one job: how many pairs, the scale, the seeds, genome -> candidate, search windows."""

    pairs: int
    scale: float
    seeds: list[Seed]
    make_candidate: Callable[..., RopeMethod]  # (factors, attention_factor=None, n_hat=0) -> RopeMethod
    windows: int = 1  # search windows each candidate is scored on
    objective: ObjectiveMix | None = None  # which objective each window serves; None: perplexity on every one
    windows_hash: str | None = None  # the search windows' content hash, recorded on every history line

    @property
    def mix(self) -> ObjectiveMix:
        return self.objective or ObjectiveMix.single(self.windows)
