"""Adding an optimizer is one class (with its state model) plus one registry entry: a random search written here,
against the `Searcher` base class, runs in memory (`optimize`), end to end through the coordinator, is read by
`status`, resumes exactly after a kill, and has the config rules its capability flags imply. Nothing else in the
package names it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from known_problem import objective, problem
from search_helpers import FunctionEvaluator, run_job, write_job_record

from longrope.search.cli.main import main
from longrope.search.config.job_config import JobConfig
from longrope.search.config.strict import JobConfigError
from longrope.search.optimizers import factory
from longrope.search.optimizers.genome import GenomeGrid
from longrope.search.optimizers.labels import generation_label
from longrope.search.optimizers.optimize import optimize
from longrope.search.optimizers.searcher import GenerationEnd, Searcher, SearcherState, SearchPlan, best_score
from longrope.search.run.run_store import RunDir


class RandomState(SearcherState):
    generation: int
    rng: dict  # the PCG64 generator's state
    told: dict[str, float | None]  # score by key (null: not finite)
    out: list[list[float]]  # the factors of the candidates asked and not told, in the order asked

    def told_scores(self) -> dict[str, float]:
        return {key: np.inf if score is None else score for key, score in self.told.items()}


class RandomSearch(Searcher):
    """Generation 0 the seeds, then `population` monotone factor vectors drawn uniformly per generation."""

    kind = "random"
    state_model = RandomState

    def __init__(self, settings, grid: GenomeGrid, seeds):
        super().__init__(settings, grid, seeds)
        self.rng = np.random.Generator(np.random.PCG64(settings.seed)).bit_generator.state
        self.told: dict[str, float | None] = {}
        self.out: list[list[float]] = []

    @staticmethod
    def plan(search, seeds: int) -> SearchPlan:
        return SearchPlan(seeds + search.generations * search.population, 0, "seeds + generations x population")

    def ask(self, count: int) -> list:
        if self.out or self.done():
            return []
        if self.generation == 0:
            self.out = [list(self.grid.factors(self.grid.from_seed(seed))) for seed in self.seeds]
        else:
            generator = np.random.Generator(np.random.PCG64())
            generator.bit_generator.state = self.rng
            top = self.grid.high * self.grid.step
            self.out = [sorted(generator.uniform(1.0, top, self.grid.pairs)) for _ in range(self.settings.population)]
            self.rng = generator.bit_generator.state
        return self.outstanding()

    def outstanding(self) -> list:
        return [self.grid.candidate(self.grid.genome(np.asarray(f)), self.generation) for f in self.out]

    def tell(self, results) -> list[GenerationEnd]:
        previous = best_score(self.state().told_scores())[1] if self.told else np.inf
        for result in results:
            self.told[result.key] = result.score if np.isfinite(result.score) else None
        self.out = [f for f, c in zip(self.out, self.outstanding(), strict=True) if c.key not in self.told]
        if self.out:
            return []
        self.generation += 1
        label = generation_label(self.generation - 1, self.total_generations)
        return [GenerationEnd(label, self.generation - 1, self.best()[1], previous)]


def config(tmp_path, windows: int = 1, **search) -> JobConfig:
    settings = {"optimizer": "random", "generations": 3, "population": 6, "parents": 2, "seed": 3, **search}
    raw = {"target_length": 256, "output_dir": str(tmp_path), "data": {"search_windows": windows}, "search": settings}
    return JobConfig.model_validate(raw)


@pytest.fixture
def registered(monkeypatch):
    """The one registry entry (undone after the test)."""
    monkeypatch.setitem(factory.SEARCHERS, RandomSearch.kind, RandomSearch)


def test_the_base_class_asks_for_ask_tell_and_plan():
    class NoTell(Searcher):
        kind, state_model = "no_tell", RandomState
        ask = RandomSearch.ask
        plan = RandomSearch.plan

    with pytest.raises(TypeError, match="tell"):
        NoTell(None, None, [])


def test_optimize_runs_it_in_memory_and_returns_the_best_told(tmp_path, registered):
    known = problem()
    searcher = factory.make_searcher(config(tmp_path).search, pairs=known.pairs, scale=known.scale, seeds=known.seeds)
    key, score = optimize(lambda c: objective(np.asarray(c.factors)), searcher, batch=4)
    told = searcher.state().told_scores()
    assert len(told) == searcher.budget == 3 + 3 * 6
    assert (key, score) == min(told.items(), key=lambda item: (item[1], item[0]))
    assert searcher.generation == searcher.total_generations == 4 and searcher.done()


def test_it_runs_through_the_coordinator_and_resumes_exactly_after_a_kill(tmp_path, registered, capsys):
    clean_dir, crash_dir = RunDir(tmp_path / "clean"), RunDir(tmp_path / "crash")
    clean_best, _ = run_job(config(clean_dir.path), clean_dir, FunctionEvaluator())
    recorded = [json.loads(line) for line in clean_dir.file("history.jsonl").read_text().splitlines()]
    assert len(recorded) == 3 + 3 * 6
    assert all(r["mean_nll"] == pytest.approx(objective(np.asarray(r["factors"])), abs=0.01) for r in recorded)

    crashing = FunctionEvaluator(fail_on_call=3)
    with pytest.raises(RuntimeError, match="simulated coordinator crash"):
        run_job(config(crash_dir.path), crash_dir, crashing)
    state = json.loads(crash_dir.file("state.json").read_text())
    assert state["optimizer"] == {"kind": "random", "state": None}, "state.json keeps no copy of a replayed searcher"
    assert (len(crash_dir.read_history()) - 3) % 6, "killed mid-generation"
    resumed = FunctionEvaluator()
    resumed_best, _ = run_job(config(crash_dir.path), crash_dir, resumed, resume=True)
    assert resumed_best == clean_best
    assert crash_dir.read_history() == clean_dir.read_history()
    assert crashing.evaluated + resumed.evaluated == len(recorded), "nothing scored twice"

    write_job_record(crash_dir.path, config(crash_dir.path))
    assert main(["status", str(crash_dir.path), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["optimizer"] == "random" and status["finished"]


def test_its_flags_are_the_config_rules(tmp_path, registered):
    assert factory.config_problem(config(tmp_path)) is None
    racing = config(tmp_path, windows=4, racing={"enabled": True, "min_windows": 2})
    assert factory.config_problem(racing) == "search.racing.enabled: racing needs optimizer 'dim_mono', got 'random'"
    n_hat = config(tmp_path, n_hat={"enabled": True, "choices": [0, 4]}).search
    known = problem()
    with pytest.raises(ValueError, match="searching n_hat needs optimizer 'dim_mono', got 'random'"):
        factory.make_searcher(n_hat, pairs=known.pairs, scale=known.scale, seeds=known.seeds)
    folder = tmp_path / "c.yaml"
    folder.write_text(f"target_length: 256\noutput_dir: {tmp_path / 'out'}\nsearch: {{optimizer: pso}}\n")
    with pytest.raises(JobConfigError, match=r"search\.optimizer = 'pso': unknown optimizer; one of .*random"):
        factory.load_job_config(folder)
