"""The dim-monotone evolution on its own: constraints, sizes, uniqueness, determinism, JSON state."""

from __future__ import annotations

import json

import numpy as np
import pytest
from known_problem import PAIRS, objective, problem
from search_helpers import result_of

from longrope.search.config.search_section import SearchConfig
from longrope.search.optimizers.evolution import DimMonoEvolution
from longrope.search.optimizers.factory import make_searcher


def run_generations(settings: SearchConfig, generations: int) -> tuple[DimMonoEvolution, list[list]]:
    evolution = make_searcher(settings, pairs=PAIRS, scale=4.0, seeds=problem().seeds)
    asked = []
    for _ in range(generations):
        candidates = evolution.ask(1)
        asked.append(candidates)
        evolution.tell([result_of(c, objective(c.factors)) for c in candidates])
    return evolution, asked


def test_every_candidate_obeys_the_constraints():
    settings = SearchConfig(seed=3)
    _, asked = run_generations(settings, 6)
    for genomes in asked:
        for candidate in genomes:
            factors = candidate.factors
            assert np.all(np.diff(factors) >= 0), "monotone non-decreasing in the pair index"
            assert factors.min() >= 1.0 and factors.max() <= 1.25 * 4.0 + 1e-9, "bounded to [1, 1.25 s]"
            np.testing.assert_allclose(factors * 100, np.round(factors * 100), atol=1e-6)  # the 0.01 grid
            assert candidate.n_hat == 0 and candidate.attention_factor is None  # both genes off by default


def test_sizes_as_configured_and_no_duplicates():
    settings = SearchConfig(population=20, parents=8, mutations=5, crossovers=3, seed=1)
    evolution, asked = run_generations(settings, 5)
    assert len(asked[0]) == 20
    assert all(len(genomes) == 8 for genomes in asked[1:])
    keys = [g.key for genomes in asked for g in genomes]
    assert len(keys) == len(set(keys)), "a candidate is never asked twice"
    assert len(evolution.population) == 8


def test_seeds_are_in_generation_zero():
    evolution, asked = run_generations(SearchConfig(), 1)
    first = asked[0]
    for seed in problem().seeds:
        expected = np.maximum.accumulate(np.clip(np.round(seed.factors, 2), 1.0, 5.0))
        assert any(np.allclose(c.factors, expected) for c in first[:3]), seed.name
    assert set(evolution.seed_names.values()) == {"pi", "ntk", "yarn"}


def test_same_seed_same_population_other_seed_other_population():
    _, first = run_generations(SearchConfig(seed=5), 4)
    _, again = run_generations(SearchConfig(seed=5), 4)
    _, other = run_generations(SearchConfig(seed=6), 4)
    assert [[g.key for g in gen] for gen in first] == [[g.key for g in gen] for gen in again]
    assert [g.key for g in first[2]] != [g.key for g in other[2]]


def test_state_round_trips_through_json():
    settings = SearchConfig(seed=9)
    evolution, _ = run_generations(settings, 3)
    restored = make_searcher(settings, pairs=PAIRS, scale=4.0, seeds=problem().seeds)
    restored.load_state(json.loads(evolution.state().model_dump_json()))
    assert [c.key for c in restored.ask(1)] == [c.key for c in evolution.ask(1)]


def test_optional_genes_stay_in_their_sets():
    settings = SearchConfig.model_validate(
        {"seed": 2, "n_hat": {"enabled": True}, "attention_factor": {"mode": "searched", "low": 1.0, "high": 1.4}}
    )
    _, asked = run_generations(settings, 5)
    genomes = [g for gen in asked for g in gen]
    assert {g.n_hat for g in genomes} <= set(settings.n_hat.choices) and len({g.n_hat for g in genomes}) > 1
    attention = {c.attention_factor for c in genomes}
    assert min(attention) >= 1.0 - 1e-9 and max(attention) <= 1.4 + 1e-9 and len(attention) > 1


def test_nan_scores_rank_last():
    settings = SearchConfig(population=10, parents=4, mutations=3, crossovers=3)
    evolution = make_searcher(settings, pairs=PAIRS, scale=4.0, seeds=problem().seeds)
    candidates = evolution.ask(1)
    scores = [float("nan")] + [float(i) for i in range(1, len(candidates))]
    evolution.tell([result_of(c, score) for c, score in zip(candidates, scores, strict=True)])
    assert candidates[0].key not in evolution.population
    assert evolution.best()[1] == pytest.approx(1.0)


def test_the_default_seeds_are_the_nominal_closed_forms_and_every_coarse_grid_setting():
    """PI, NTK and YaRN at their nominal settings, then the coarse grids' settings: NTK at 1, 1.5 and 2 times the
    scale with attention 1, 1.1 and LongRoPE's (9), YaRN at 1 and 1.5 times with its own, 1 and LongRoPE's (6), so
    18 seeds where the attention factor is searched, and 8 (one per scale) where it is not; a population of 8 then
    starts with all 18 (none dropped), and the plan counts them."""
    search = SearchConfig()
    assert search.seeds == ("pi", "ntk", "yarn", "ntk_tuned", "yarn_tuned")
    assert search.most_seeds() == 3 + 3 + 2  # the attention factor is LongRoPE's: one seed per scale
    searched = SearchConfig(attention_factor={"mode": "searched"})
    assert searched.most_seeds() == 3 + 3 * 3 + 2 * 3  # every setting: the attention factor is a gene
    small = SearchConfig(population=8, parents=4, mutations=2, crossovers=2, generations=3)
    assert DimMonoEvolution.plan(small, searched.most_seeds()).candidates == 18 + 3 * 4
    assert DimMonoEvolution.plan(SearchConfig(), 18).candidates == 64 + 40 * 32  # a population above the seeds
