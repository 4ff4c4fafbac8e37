"""A generation with fewer candidates than workers, its windows cut over them (search/run/window_ranges.py): the
ranges a descent step, its seeds and its point on the grid go out in, worked by hand; a range that fails, a
candidate asked twice, and a resumed polish step whose trials go out as the uninterrupted run sent them. On the
cheap known objective (no model, no Ray)."""

from __future__ import annotations

import numpy as np
import pytest
from known_problem import problem, window_nll
from search_helpers import FunctionEvaluator, make_coordinator
from test_gradient_search import WINDOWS, history, hybrid, job, run, smooth

from longrope.search.optimizers.gradient import GradientDescent
from longrope.search.run.run_store import RunDir
from longrope.workers.task_failure import TaskFailure


def test_windows_cut_over_more_workers_give_the_same_run(tmp_path):
    """Data-parallel: a generation with fewer candidates than workers has its windows cut over them. On 8 windows
    (2 held out) and 3 workers, by hand: a step's gradient windows [0, 6) (weighing 3 x 6 against the held-out
    windows' 2) take two of its three ranges, [0, 3) and [3, 6) with a backward pass, and its held-out [6, 8) one;
    the point rounded to the grid goes out as [0, 2), [2, 5), [5, 8); the seeds, as many as the workers, whole. The
    history is the one-worker run's, line for line."""
    runs = {}
    for workers in (1, 3):
        run_dir = tmp_path / str(workers)
        config = job(run_dir, "data.search_windows=8", "search.gradient.steps=2", "search.gradient.patience=null")
        store = RunDir(run_dir)
        store.create(config)
        evaluator = smooth(windows=8, workers=workers)
        make_coordinator(config, store, evaluator, problem(8)).run()
        runs[workers] = (history(run_dir), evaluator.submitted)
    (one, one_sent), (three, three_sent) = runs[1], runs[3]
    assert [(r["key"], r["mean_nll"], r.get("gradient")) for r in one] == [
        (r["key"], r["mean_nll"], r.get("gradient")) for r in three
    ]
    seeds = [r["key"] for r in three if r["generation"] == 0]
    step, rounded = [r["key"] for r in three if r["generation"] == 1], [r["key"] for r in three if r["generation"] == 3]
    assert len(seeds) >= 3 and len(step) == 1 and len(rounded) == 1
    sent = {key: sorted((windows, gradient) for k, windows, gradient in three_sent if k == key) for key in seeds}
    assert all(ranges == [((0, 8), False)] for ranges in sent.values())
    step_sent = sorted((windows, gradient) for key, windows, gradient in three_sent if key == step[0])
    assert step_sent == [((0, 3), True), ((3, 6), True), ((6, 8), False)]
    rounded_sent = sorted(windows for key, windows, _ in three_sent if key == rounded[0])
    assert rounded_sent == [(0, 2), (2, 5), (5, 8)]
    assert sorted(w for k, w, _ in one_sent if k == step[0]) == [(0, 6), (6, 8)]  # one worker: nothing cut


class FailingRange(FunctionEvaluator):
    """A pool whose range starting at window `start` (forward only) fails on every worker it is tried on; results
    come in the order sent."""

    def __init__(self, start: int, **kwargs):
        super().__init__(**kwargs)
        self.start = start

    def as_completed(self):
        while self.pending:
            key, candidate, windows, gradient = self.pending.pop(0)
            if windows[0] == self.start and not gradient:
                yield key, TaskFailure("RuntimeError: CUDA out of memory", 3)
            else:
                yield key, self._score(candidate, windows, gradient)


def test_a_failed_range_keeps_only_the_windows_before_it(tmp_path):
    """The point rounded to the grid goes out as [0, 2), [2, 5), [5, 8) over 3 workers; [0, 2) comes back, then
    [2, 5) fails. Its line is failed, with windows 0 and 1's NLL at their places, and [5, 8), back after it, is
    dropped (never recorded after them as if it were windows 2-4); the run ends."""
    config = job(tmp_path, "data.search_windows=8", "search.gradient.steps=2", "search.gradient.patience=null")
    store = RunDir(tmp_path)
    store.create(config)
    evaluator = FailingRange(2, windows=8, wobble=0.0, workers=3)
    make_coordinator(config, store, evaluator, problem(8)).run()
    (failed,) = [r for r in history(tmp_path) if r["status"] == "failed"]
    assert failed["generation"] == 3 and failed["error"] == "RuntimeError: CUDA out of memory"
    factors = np.asarray(failed["factors"])
    assert failed["nll"] == [pytest.approx(window_nll(factors, j, 8, 0.0), rel=1e-12) for j in (0, 1)]


class AskingTwice(GradientDescent):
    """Descent whose every ask repeats its first candidate, as CMA-ES's can when two samples round to one genome."""

    def ask(self, count: int = 1):
        batch = super().ask(count)
        return batch + batch[:1]


def test_a_candidate_asked_twice_in_a_generation_is_scored_and_told_once(tmp_path):
    """The repeat is neither scored again nor counted in the generation's size: the history is the run's without
    repeats, line for line, and each range went out once."""
    lines = {}
    for repeats in (False, True):
        run_dir = tmp_path / str(repeats)
        config = job(run_dir, "data.search_windows=8", "search.gradient.steps=2", "search.gradient.patience=null")
        store = RunDir(run_dir)
        store.create(config)
        evaluator = smooth(windows=8, workers=3)
        coordinator = make_coordinator(config, store, evaluator, problem(8))
        if repeats:
            coordinator.searcher.__class__ = AskingTwice
        coordinator.run()
        lines[repeats] = [(r["key"], r["mean_nll"]) for r in history(run_dir)]
        assert len(evaluator.submitted) == len(set(evaluator.submitted))
    assert lines[True] == lines[False]


class CrashInCall(FunctionEvaluator):
    """Crashes in its `call`-th call, after `results` of that call's results came back (newest sent first)."""

    def __init__(self, call: int, results: int, **kwargs):
        super().__init__(**kwargs)
        self.call, self.results = call, results

    def as_completed(self):
        self.calls += 1
        for count in range(len(self.pending)):
            if self.calls == self.call and count == self.results:
                raise RuntimeError("simulated coordinator crash in the middle of a generation")
            key, candidate, windows, gradient = self.pending.pop()
            yield key, self._score(candidate, windows, gradient)


def test_a_resumed_polish_step_cuts_its_trials_as_the_uninterrupted_run(tmp_path):
    """A hybrid with 3 line-search trials a step on 8 workers: each trial's 4 windows go out in ceil(8 / 3) = 3
    ranges, [0, 1) and [1, 2) with a backward pass and the held-out [2, 4). Killed once the last trial of the
    polish's second step is in (its 3 ranges), the resumed run sends the other two in the same ranges (its
    generation is still 3 trials, not the 2 left), and ends where the uninterrupted run ends."""
    overrides = ("search.gradient.polish_probes=3", "search.gradient.polish_every=null")
    clean = smooth(workers=8)
    clean_best, _ = run(hybrid(tmp_path / "clean", *overrides), tmp_path / "clean", clean)
    crashed = tmp_path / "crash"
    config = hybrid(crashed, *overrides)
    with pytest.raises(RuntimeError, match="simulated coordinator crash"):
        run(config, crashed, CrashInCall(7, 3, windows=WINDOWS, wobble=0.0, workers=8))
    resumed = smooth(workers=8)
    best, _ = run(config, crashed, resumed, resume=True)
    assert best == clean_best
    first = resumed.submitted[:6]  # the step's other two trials go out first, 3 ranges each
    assert len({key for key, _, _ in first}) == 2
    assert sorted((windows, gradient) for _, windows, gradient in first) == sorted(
        [((0, 1), True), ((1, 2), True), ((2, 4), False)] * 2
    )
    assert all(r in clean.submitted for r in resumed.submitted)
