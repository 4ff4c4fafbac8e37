"""Racing on paired windows: the rule worked by hand, and on the known objective it never stops the eventual best,
never lets a stopped candidate become a parent, saves window evaluations, and resumes exactly."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from known_problem import window_nll
from search_helpers import FunctionEvaluator, run_job

from longrope.search.config.job_config import JobConfig
from longrope.search.config.search_section import RacingConfig
from longrope.search.run.racing import clearly_worse, window_groups
from longrope.search.run.run_store import RunDir

WINDOWS = 8


def job(tmp_path, racing: bool = True, **search) -> JobConfig:
    return JobConfig.model_validate(
        {
            "target_length": 256,
            "output_dir": str(tmp_path),
            "data": {"search_windows": WINDOWS},
            "search": {"generations": 12, "seed": 4, "racing": {"enabled": racing}, **search},
        }
    )


def history_lines(run_dir: RunDir) -> list[dict]:
    return [json.loads(line) for line in run_dir.file("history.jsonl").read_text().splitlines()]


# ---- the rule, by hand ----


def test_window_groups():
    on = RacingConfig(enabled=True, min_windows=2, group_windows=1)
    assert window_groups(8, on) == [(0, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (7, 8)]
    assert window_groups(8, on.model_copy(update={"group_windows": 3})) == [(0, 2), (2, 5), (5, 8)]
    assert window_groups(8, on.model_copy(update={"enabled": False})) == [(0, 8)]
    assert window_groups(2, on) == [(0, 2)], "min_windows covers every window: nothing to race"


def test_clearly_worse_is_the_one_sided_paired_bound():
    rule = RacingConfig(enabled=True, z=2.0, min_windows=2)
    # diffs per token 0.5, 0.3, 0.4: mean 0.4, sd 0.1, bound 0.4 - 2 * 0.1 / sqrt(3) = 0.2845 > 0
    tokens = [10, 10, 10]
    parent = [20.0, 30.0, 40.0]
    child = [25.0, 33.0, 44.0]
    assert clearly_worse(child, tokens, parent, tokens, rule)
    # with z = 8 the bound is 0.4 - 8 * 0.0577 = -0.062: not yet
    assert not clearly_worse(child, tokens, parent, tokens, rule.model_copy(update={"z": 8.0}))
    assert not clearly_worse(child[:1], tokens[:1], parent, tokens, rule), "one window: no decision before min"
    # diffs +1 and -1: mean 0, never clearly worse
    assert not clearly_worse([11.0, 9.0], [1, 1], [10.0, 10.0], [1, 1], rule)
    # equal diffs (sd 0): worse by any positive margin
    assert clearly_worse([10.5, 20.5], [1, 1], [10.0, 20.0], [1, 1], rule)
    # better than the parent: never stopped
    assert not clearly_worse([9.0, 19.0], [1, 1], [10.0, 20.0], [1, 1], rule)
    # a window the child could not score (inf or NaN): it would rank last anyway
    assert clearly_worse([math.inf, 1.0], [1, 1], [10.0, 20.0], [1, 1], rule)
    assert clearly_worse([math.nan, 1.0], [1, 1], [10.0, 20.0], [1, 1], rule)
    # per token: 30 nats over 20 tokens (1.5) vs 16 over 10 (1.6) is better, though the sum is larger
    assert not clearly_worse([30.0, 30.0], [20, 20], [16.0, 16.0], [10, 10], rule)


# ---- on the known objective ----


@pytest.fixture(scope="module")
def exact_windows(tmp_path_factory):
    """Plain and raced runs on windows that differ only in difficulty (no wobble): every paired difference has the
    sign of the true difference, so every stop is right and racing may change nothing but the cost."""
    base = tmp_path_factory.mktemp("racing-exact")
    plain_dir, raced_dir = RunDir(base / "plain"), RunDir(base / "raced")
    plain, raced = FunctionEvaluator(windows=WINDOWS, wobble=0.0), FunctionEvaluator(windows=WINDOWS, wobble=0.0)
    plain_best, _ = run_job(job(plain_dir.path, racing=False), plain_dir, plain)
    raced_best, coordinator = run_job(job(raced_dir.path), raced_dir, raced)
    return plain_dir, plain_best, plain, raced_dir, raced_best, raced, coordinator


@pytest.fixture(scope="module")
def noisy_windows(tmp_path_factory):
    """A raced run on windows with candidate-specific noise that paired differences do not cancel."""
    run_dir = RunDir(tmp_path_factory.mktemp("racing-noisy") / "raced")
    evaluator = FunctionEvaluator(windows=WINDOWS)
    best, coordinator = run_job(job(run_dir.path), run_dir, evaluator)
    return run_dir, best, evaluator, coordinator


def test_with_exact_windows_racing_changes_only_the_cost(exact_windows):
    plain_dir, plain_best, plain, raced_dir, raced_best, raced, _ = exact_windows
    stopped = {r.key for r in raced_dir.read_history().values() if r.status == "stopped"}
    assert stopped, "the known objective's children include clearly worse ones"
    assert plain_best.key not in stopped
    assert raced_best.key == plain_best.key and raced_best.mean_nll == plain_best.mean_nll
    assert set(raced_dir.read_history()) == set(plain_dir.read_history()), "the same candidates, so no stop erred"
    assert raced.window_evaluations < 0.9 * plain.window_evaluations
    assert plain.window_evaluations == WINDOWS * len(plain_dir.read_history())


def test_racing_never_stops_the_eventual_best(noisy_windows):
    """No stopped candidate, scored on all windows (here, from the known objective), beats the run's best."""
    run_dir, best, _, _ = noisy_windows
    stopped = [r for r in run_dir.read_history().values() if r.status == "stopped"]
    assert stopped
    full = [np.mean([window_nll(np.asarray(r.factors), j, WINDOWS) for j in range(WINDOWS)]) for r in stopped]
    assert min(full) > best.mean_nll
    assert best.status == "scored" and len(best.nll) == WINDOWS


@pytest.mark.parametrize("windows", ["exact_windows", "noisy_windows"])
def test_a_stopped_candidate_is_recorded_and_never_a_parent(windows, request):
    *_, coordinator = request.getfixturevalue(windows)
    history = coordinator.run_dir.read_history()
    for record in history.values():
        if record.status == "stopped":
            assert record.mean_nll is None and record.perplexity is None
            assert 3 <= len(record.nll) < WINDOWS and len(record.tokens) == len(record.nll)
        else:
            assert record.status == "scored" and len(record.nll) == WINDOWS
    parents = coordinator.searcher.population
    assert parents and all(history[key].status == "scored" for key in parents)
    stopped = [key for key, r in history.items() if r.status == "stopped"]
    assert stopped and all(math.isinf(coordinator.searcher.scores[key]) for key in stopped), "told as last"


def test_each_stop_came_after_the_parents_were_all_there(exact_windows):
    """The threshold exists only once `parents` candidates are scored: generation 0 is never raced, and a
    stopped child is worse than the `parents`-th best of everything scored before its generation."""
    *_, raced_dir, _, _, coordinator = exact_windows
    history = raced_dir.read_history()
    parents = coordinator.settings.parents
    for record in history.values():
        if record.status != "stopped":
            continue
        earlier = sorted(
            r.mean_nll for r in history.values() if r.status == "scored" and r.generation < record.generation
        )
        assert record.generation > 0 and len(earlier) >= parents
        factors = np.asarray(record.factors)
        full = float(np.mean([window_nll(factors, j, WINDOWS, 0.0) for j in range(WINDOWS)]))
        assert full > earlier[parents - 1], "a stopped child would have become a parent"


def test_racing_crash_then_resume_equals_a_clean_run_and_scores_no_window_twice(tmp_path, noisy_windows):
    clean_dir, clean_best, clean_evaluator, _ = noisy_windows
    crash_dir = RunDir(tmp_path / "crash")
    crashing = FunctionEvaluator(fail_on_call=6, windows=WINDOWS)
    with pytest.raises(RuntimeError, match="simulated coordinator crash"):
        run_job(job(crash_dir.path), crash_dir, crashing)
    resumed = FunctionEvaluator(windows=WINDOWS)
    resumed_best, _ = run_job(job(crash_dir.path), crash_dir, resumed, resume=True)
    assert resumed_best == clean_best
    clean_state = json.loads(clean_dir.file("state.json").read_text())
    crashed_state = json.loads(crash_dir.file("state.json").read_text())
    assert crashed_state["optimizer"] == clean_state["optimizer"]
    assert crashed_state["progress"] == clean_state["progress"]
    assert crash_dir.read_history() == clean_dir.read_history()
    assert crashing.window_evaluations + resumed.window_evaluations == clean_evaluator.window_evaluations


def test_a_partial_record_is_continued_from_its_next_window(tmp_path):
    """Kill right after the first group of a raced child is recorded: the resumed run scores only the rest."""
    config = job(tmp_path / "run", generations=2)
    run_dir = RunDir(tmp_path / "run")
    clean_dir = RunDir(tmp_path / "clean")
    clean = FunctionEvaluator(windows=WINDOWS)
    run_job(job(clean_dir.path, generations=2), clean_dir, clean)

    class StopAfterPartial(FunctionEvaluator):
        def as_completed(self):
            for item in super().as_completed():
                yield item
                lines = history_lines(run_dir)
                if lines[-1]["status"] == "partial":
                    raise RuntimeError("killed after a partial record")

    first = StopAfterPartial(windows=WINDOWS)
    with pytest.raises(RuntimeError, match="killed after a partial record"):
        run_job(config, run_dir, first)
    partial = history_lines(run_dir)[-1]
    resumed = FunctionEvaluator(windows=WINDOWS)
    run_job(config, run_dir, resumed, resume=True)
    assert len(run_dir.read_history()[partial["key"]].nll) > len(partial["nll"])
    assert first.window_evaluations + resumed.window_evaluations == clean.window_evaluations
    assert run_dir.read_history() == clean_dir.read_history()
