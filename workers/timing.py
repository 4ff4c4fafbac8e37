"""Timing a piece of work the one way this project times it: alternating rounds, after a warm-up call.

Used by `longrope estimate --gpu cpu` (search/cost/cpu_rates.py times this machine's rates) and by the benchmarks
in bench/, which time two or more things side by side. Alternating matters on a shared machine: each round runs
every function once, so load that drifts during the run hits all of them alike and their ratio holds. The first
call of a function grows allocator pools, loads kernels and fills caches, so by default each runs once untimed.

Which statistic to take is the caller's: the median of the rounds (a typical run), or the least ("the lowest
value gives a lower bound for how fast your machine can run the given code snippet; higher values ... are
typically ... caused by ... other processes interfering", Python's timeit documentation, Timer.repeat).

Pure standard library, so the estimate's modules and `longrope --help` pay nothing for it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

Clock = Callable[[], float]
Name = TypeVar("Name")


def alternating_times(
    fns: Mapping[Name, Callable[[], object]], rounds: int, *, clock: Clock = time.perf_counter, warm_up: bool = True
) -> dict[Name, list[float]]:
    """Seconds (by `clock`) of each function in each of `rounds` rounds; every round calls them all, in order.
    With `warm_up`, each is called once before the first round, untimed."""
    if warm_up:
        for fn in fns.values():
            fn()
    times: dict[Name, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
    return times


def median_seconds(fn: Callable[[], object], repeats: int, clock: Clock = time.perf_counter) -> float:
    """Median time of `fn` over `repeats` calls after one warm-up call."""
    return statistics.median(alternating_times({"fn": fn}, repeats, clock=clock)["fn"])


def least_seconds(fn: Callable[[], object], repeats: int, clock: Clock = time.perf_counter) -> float:
    """Least time of `fn` over `repeats` calls after one warm-up call (timeit's advice, module docstring)."""
    return min(alternating_times({"fn": fn}, repeats, clock=clock)["fn"])
