"""How busy a pool keeps its workers: the share of workers x wall time during which a worker has a scoring call out.

A GPU that waits for the coordinator, for a generation's slowest candidate, or for the next descent step is paid
for and idle; this is the figure that says how much (`longrope status` prints it from heartbeat.json). A worker
counts as busy while it holds a scoring call (the pool keeps `calls_per_worker` queued on it, so the gap between
two calls is a transfer, not a wait), from the call's send to its collection: a call that finished while the
coordinator was recording another result counts until it is collected, so the share reads a little high where the
coordinator is slow next to the calls. The clock starts at the first scoring call: loading the model is not the
schedule's doing. Replacements of retired workers count in the workers' total busy time, against the workers the
pool started.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class BusyTime(BaseModel):
    """Workers' busy seconds against workers x wall seconds since the first scoring call (heartbeat.json)."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

    workers: int = Field(ge=1)
    busy_s: float = Field(ge=0)
    wall_s: float = Field(ge=0)

    @property
    def fraction(self) -> float | None:
        """busy / (workers x wall), at most 1; None before any call went out."""
        if self.wall_s <= 0:
            return None
        return min(1.0, self.busy_s / (self.workers * self.wall_s))


class BusyClock:
    """Busy intervals per worker, from the pool's sends and answers (`update` after each)."""

    def __init__(self, workers: int):
        self.workers = max(1, workers)
        self.started: float | None = None  # the first scoring call
        self.since: dict[int, float] = {}  # worker index -> start of its current busy interval
        self.busy_s = 0.0  # closed intervals

    def update(self, scoring: set[int], now: float) -> None:
        """`scoring`: the workers holding a scoring call at `now`."""
        if scoring and self.started is None:
            self.started = now
        for index in scoring - self.since.keys():
            self.since[index] = now
        for index in self.since.keys() - scoring:
            self.busy_s += now - self.since.pop(index)

    def reading(self, now: float) -> BusyTime:
        """The busy time so far, open intervals counted to `now`."""
        if self.started is None:
            return BusyTime(workers=self.workers, busy_s=0.0, wall_s=0.0)
        open_s = sum(now - since for since in self.since.values())
        return BusyTime(workers=self.workers, busy_s=self.busy_s + open_s, wall_s=now - self.started)
