"""The steady-state schedule and the CMA-ES optimizer, on the known objective (no model): budgets, a full queue,
kills at random points that lose nothing and score nothing twice, and CMA-ES's replay resume."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from known_problem import PAIRS, objective, problem
from search_helpers import (
    FunctionEvaluator,
    built_searcher,
    make_coordinator,
    replayed_state,
    restore,
    result_of,
    run_job,
)

from longrope.search.config.job_config import JobConfig
from longrope.search.optimizers.cmaes import CmaesOptimizer
from longrope.search.optimizers.factory import make_searcher
from longrope.search.optimizers.genome import Genome, GenomeGrid
from longrope.search.optimizers.history_record import recorded_factors
from longrope.search.run.run_store import RunDir, best_of

WINDOWS = 8


def job(tmp_path, windows: int = 1, **search) -> JobConfig:
    return JobConfig.model_validate(
        {
            "target_length": 256,
            "output_dir": str(tmp_path),
            "data": {"search_windows": max(windows, 4)},
            "search": {"generations": 10, "seed": 5, "population": 16, "parents": 8, **search},
        }
    )


def final_lines(run_dir: RunDir) -> list[dict]:
    lines = [json.loads(line) for line in run_dir.file("history.jsonl").read_text().splitlines()]
    return [r for r in lines if r["status"] != "partial"]


class QueueEvaluator(FunctionEvaluator):
    """First in, first out, one result per step; records how many candidates were out at each step."""

    def __init__(self, kill_after: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.kill_after = kill_after
        self.outstanding: list[int] = []
        self.results = 0

    def as_completed(self):
        while self.pending:
            self.outstanding.append(len(self.pending))
            key, candidate, windows, gradient = self.pending.pop(0)
            if self.kill_after is not None and self.results == self.kill_after:
                raise KeyboardInterrupt("killed")  # the process dies with this candidate in flight
            self.results += 1
            yield key, self._score(candidate, windows, gradient)


# ---- steady ----


def test_steady_spends_the_budget_keeps_the_queue_full_and_improves(tmp_path):
    config = job(tmp_path, schedule="steady")
    evaluator = QueueEvaluator(capacity=6)
    best, coordinator = run_job(config, RunDir(tmp_path), evaluator)
    finals = final_lines(RunDir(tmp_path))
    budget = 16 + (16 + 16) * 10
    assert len(finals) == len({r["key"] for r in finals}) == budget, "the GA's budget, each candidate once"
    # after generation 0 (16 out at once), exactly `capacity` candidates are out until the budget runs low
    steady_part = evaluator.outstanding[16 : budget - 6]
    assert steady_part and set(steady_part) == {6}
    seed_best = min(objective(seed.factors) for seed in problem().seeds)
    assert best.mean_nll < 0.2 * seed_best
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["finished"] and state["optimizer"]["state"]["pending"] == []
    assert coordinator.searcher.generation == 11
    assert state["optimizer"]["state"]["told"] is None, "the told genomes and scores are history.jsonl's"
    resumed = built_searcher(config, problem())
    restore(RunDir(tmp_path), resumed)
    assert resumed.state() == coordinator.searcher.state(), "rebuilt from history.jsonl, in the order told"


def test_steady_children_come_from_the_parents_of_the_moment(tmp_path):
    """(mu + lambda) with lambda = 1: the parents after each tell are the best `parents` of all told so far."""
    settings = job(tmp_path, schedule="steady").search
    optimizer = make_searcher(settings, pairs=PAIRS, scale=4.0, seeds=problem().seeds)
    initial = optimizer.ask(3)
    assert len(initial) == 16, "generation 0 is the whole initial population"
    assert optimizer.ask(3) == [], "nothing more while generation 0 is out"
    optimizer.tell([result_of(c, objective(c.factors)) for c in initial])
    for _ in range(40):
        (child,) = optimizer.ask(1)
        optimizer.tell([result_of(child, objective(child.factors))])
        ranked = sorted(optimizer.scores, key=lambda key: (optimizer.scores[key], key))
        assert optimizer.population == ranked[: settings.parents]


@pytest.mark.parametrize("racing", [False, True], ids=["plain", "racing"])
@pytest.mark.parametrize("kill_at", ["result", "append"])
def test_steady_killed_at_random_points_loses_nothing_and_scores_nothing_twice(tmp_path, racing, kill_at, monkeypatch):
    """Killed as a result arrives (in flight), or right after a history line is appended (before state.json is
    written): the resumed runs together score every candidate once, and every window once."""
    windows = WINDOWS if racing else 1
    config = job(tmp_path, windows=windows, schedule="steady", racing={"enabled": racing})
    run_dir = RunDir(tmp_path)
    draw = random.Random(11)
    appended = {"lines": 0, "kill_at": None}
    append = RunDir.append_history

    def append_then_maybe_die(self, record):
        append(self, record)
        appended["lines"] += 1
        if appended["lines"] == appended["kill_at"]:
            raise KeyboardInterrupt("killed after an append")

    monkeypatch.setattr(RunDir, "append_history", append_then_maybe_die)
    evaluators, kills, resume = [], 0, False
    while True:
        kill_after = draw.randrange(1, 40)
        evaluator = QueueEvaluator(kill_after=kill_after if kill_at == "result" else None, windows=windows, capacity=5)
        appended["kill_at"] = appended["lines"] + kill_after if kill_at == "append" else None
        evaluators.append(evaluator)
        try:
            _, last = run_job(config, run_dir, evaluator, resume=resume)
            break
        except KeyboardInterrupt:
            kills += 1
            resume = True
    assert kills >= 5
    lines = [json.loads(line) for line in run_dir.file("history.jsonl").read_text().splitlines()]
    finals = [r for r in lines if r["status"] != "partial"]
    assert len(finals) == len({r["key"] for r in finals}), "a candidate scored twice"
    assert len(finals) == 16 + 32 * 10, "a candidate lost"
    assert {r["key"] for r in lines} == {r["key"] for r in finals}, "a partly scored candidate was dropped"
    recorded_windows = sum(len(r["nll"]) for r in finals)
    assert sum(e.window_evaluations for e in evaluators) == recorded_windows, "a window scored twice"
    state = json.loads(run_dir.file("state.json").read_text())
    assert state["finished"] and set(state["optimizer"]["state"]["population"]) <= {r["key"] for r in finals}
    rebuilt = built_searcher(config, problem(windows))
    restore(run_dir, rebuilt)
    assert rebuilt.state() == last.searcher.state(), "what it was told, read back from history.jsonl in order"


# ---- CMA-ES ----


def cmaes(settings_overrides: dict | None = None) -> CmaesOptimizer:
    settings = job("unused", optimizer="cmaes", **(settings_overrides or {})).search
    return make_searcher(settings, pairs=PAIRS, scale=4.0, seeds=problem().seeds)


def test_cmaes_parametrisation_is_monotone_and_round_trips_the_seeds():
    optimizer = cmaes()
    grid: GenomeGrid = optimizer.grid
    for seed in problem().seeds:
        genome = grid.from_seed(seed)
        assert optimizer.decode(optimizer.encode(genome)) == genome
    rng = np.random.default_rng(0)
    for _ in range(200):
        genome = optimizer.decode(rng.normal(0.3, 0.5, size=PAIRS))
        assert grid.is_valid(genome)
    # worked by hand: log f0 = log 2, increments log 1.5 and a negative one (clipped to 0)
    x = np.array([np.log(2.0), np.log(1.5), -0.3] + [0.0] * (PAIRS - 3))
    assert optimizer.grid.factors(optimizer.decode(x))[:4].tolist() == [2.0, 3.0, 3.0, 3.0]


def test_cmaes_is_sized_by_its_own_settings_or_by_the_gas():
    """Own sizing: pycma's default population 4 + floor(3 ln 16) = 4 + 8 = 12 for 16 pairs (Hansen 2016, Table 1),
    `cmaes.generations` of them after the 3 seeds. Sizing 'ga': the GA's budget, 16 + 10 x 32 = 336 candidates,
    spent in generations of 16 + 16 samples."""
    own = cmaes({"cmaes": {"generations": 7}})
    assert (own.popsize, own.iterations, own.budget, own.total_generations) == (12, 7, 3 + 7 * 12, 8)
    assert cmaes({"cmaes": {"generations": 7, "population": 5}}).budget == 3 + 7 * 5
    stored = job("unused", optimizer="cmaes").model_dump(mode="json")
    stored["search"]["cmaes"]["sizing"] = "ga"
    by_ga = JobConfig.model_validate(stored).search
    searcher = make_searcher(by_ga, pairs=PAIRS, scale=4.0, seeds=problem().seeds)
    assert searcher.popsize == 32 and searcher.iterations == -(-(336 - 3) // 32) == 11


def run_cmaes(optimizer: CmaesOptimizer, generations: int) -> None:
    for _ in range(generations):
        candidates = optimizer.ask(1)
        optimizer.tell([result_of(c, objective(c.factors)) for c in candidates])


def test_cmaes_replay_resume_reaches_the_uninterrupted_state():
    uninterrupted = cmaes()
    run_cmaes(uninterrupted, 6)
    np.random.seed(123)  # the global generator must not matter
    restored = cmaes()
    restored.load_state(json.loads(uninterrupted.state().model_dump_json()))
    assert np.array_equal(restored.es.mean, uninterrupted.es.mean)
    assert restored.es.sigma == uninterrupted.es.sigma
    assert np.array_equal(restored.es.C, uninterrupted.es.C)
    assert [c.key for c in restored.ask(1)] == [c.key for c in uninterrupted.ask(1)]


def test_cmaes_replay_refuses_a_state_that_does_not_replay():
    optimizer = cmaes()
    run_cmaes(optimizer, 3)
    state = json.loads(optimizer.state().model_dump_json())
    state["asked_keys"][1][0] = Genome((100,) * PAIRS).key
    with pytest.raises(ValueError, match="replaying CMA-ES generation 2 asks for other candidates"):
        cmaes().load_state(state)


def test_cmaes_search_improves_on_the_best_seed_and_resumes_exactly(tmp_path):
    config = job(tmp_path / "clean", optimizer="cmaes")
    clean_best, coordinator = run_job(config, RunDir(tmp_path / "clean"), FunctionEvaluator())
    seed_best = min(objective(seed.factors) for seed in problem().seeds)
    assert clean_best.mean_nll < 0.5 * seed_best
    assert coordinator.searcher.generation == coordinator.searcher.total_generations
    crash_dir = RunDir(tmp_path / "crash")
    crashing = FunctionEvaluator(fail_on_call=5)
    with pytest.raises(RuntimeError, match="simulated coordinator crash"):
        run_job(job(crash_dir.path, optimizer="cmaes"), crash_dir, crashing)
    resumed = FunctionEvaluator()
    resumed_best, _ = run_job(job(crash_dir.path, optimizer="cmaes"), crash_dir, resumed, resume=True)
    assert resumed_best == clean_best
    assert crash_dir.read_history() == RunDir(tmp_path / "clean").read_history()
    clean_history = RunDir(tmp_path / "clean").read_history()
    assert crashing.evaluated + resumed.evaluated == len(clean_history), "nothing scored twice"


@pytest.mark.parametrize("schedule", ["generational", "steady"])
def test_a_used_up_grid_finishes_the_run_and_a_resume_does_not_try_again(tmp_path, schedule):
    """Factors in {1.0, 1.5} on 16 monotone pairs: 17 genomes in all, fewer than the budget."""
    config = job(tmp_path, schedule=schedule, grid_step=0.5, max_factor=1.5, population=8, parents=4)
    best, _ = run_job(config, RunDir(tmp_path), QueueEvaluator(capacity=3))
    finals = final_lines(RunDir(tmp_path))
    assert len(finals) == len({r["key"] for r in finals}) <= 17
    assert best == best_of(RunDir(tmp_path).read_history())
    state = json.loads((tmp_path / "state.json").read_text())
    own = state["optimizer"]["state"] or replayed_state(config, RunDir(tmp_path))  # steady: kept; else: replayed
    assert own["exhausted"] and state["finished"]
    resumed = make_coordinator(config, RunDir(tmp_path), QueueEvaluator(capacity=3), resume=True)
    assert resumed.finished


def test_a_steady_state_with_searched_attention_and_n_hat_resumes_from_the_history(tmp_path):
    """Format 4 keeps no told genomes: each is rebuilt from its line's factors (6 decimals), attention factor and
    n_hat, and must give its key back; the rebuilt GA is the one that ran, told in the same order."""
    settings = job(
        tmp_path,
        schedule="steady",
        attention_factor={"mode": "searched"},
        n_hat={"enabled": True, "choices": [0, 16, 64]},
    ).search
    optimizer = make_searcher(settings, pairs=PAIRS, scale=4.0, seeds=problem().seeds)
    records = []
    for _ in range(12):
        results = [result_of(c, objective(c.factors)) for c in optimizer.ask(2)]
        optimizer.tell(results)
        records += [r.model_copy(update={"factors": recorded_factors(r.factors)}) for r in results]
    told = optimizer.state().told
    assert len({genome[2] for genome, _ in told}) > 1 and len({genome[1] for genome, _ in told}) > 1
    restored = make_searcher(settings, pairs=PAIRS, scale=4.0, seeds=problem().seeds)
    restored.resume(json.loads(optimizer.stored_state().model_dump_json()), records)
    assert restored.state() == optimizer.state()
