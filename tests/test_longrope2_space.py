"""The LongRoPE2 search space (`search.space: longrope2`) and `longrope encodings critical-dim`: no model, no Ray.

LongRoPE2 (arXiv 2502.20082; microsoft/LongRoPE evolution/search.py, dim_mono.py): pairs i >= d_cd are searched on
the grid within [S, length_scale], strictly increasing, the last at most 4 above the one before; pairs i < d_cd are
lambda_cd^(i/d_cd). Every expected value here is computed independently of search/optimizers/genome.py.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from known_problem import PAIRS, objective, problem
from search_helpers import result_of

from longrope.encodings.critical_dim import critical_dim, pair_periods
from longrope.search.cli.main import main
from longrope.search.config.search_section import SearchConfig
from longrope.search.optimizers.factory import make_searcher
from longrope.search.optimizers.genome import Genome, SearchSpace, Seed, resolve_space
from longrope.search.optimizers.history_record import recorded_factors

SCALE = 4.0  # known_problem: 64 -> 256 tokens, 16 pairs, theta 1e4


# ---- the critical dimension ----


def first_pair_reaching(theta: float, d: int, length: int) -> int:
    """The first pair whose period 2pi theta^(2i/d) is at least L0 (d/2 if none), by walking the periods."""
    return next((i for i in range(d // 2) if 2 * math.pi * theta ** (2 * i / d) >= length), d // 2)


def test_critical_dim_worked_by_hand():
    # LongRoPE2 (arXiv 2502.20082, sec. 3; microsoft/LongRoPE evolution/search.py):
    # d_cd = ceil(log_theta(L0 / 2pi) * d/2) - 1. Llama-3-8B: log(8192 / 2pi) / log(5e5) * 64 = 7.1731 / 13.1224 * 64
    # = 34.98 -> ceil 35, minus 1 (the official example script overrides it by hand to 33)
    assert critical_dim(5e5, 128, 8192) == 34
    # our reference model (theta 1e4, d 32, L0 128): log(128 / 2pi) / log(1e4) * 16 = 3.0143 / 9.2103 * 16 = 5.236
    # -> ceil 6, minus 1 = 5. By the periods: pair 5 turns once in 2pi 1e4^(10/32) = 111.7 tokens (< 128), pair 6
    # in 2pi 1e4^(12/32) = 198.7 (>= 128): pair 6 is the first whose period reaches L0, and d_cd is the pair before.
    assert 2 * math.pi * 1e4 ** (10 / 32) == pytest.approx(111.73, abs=0.01)
    assert 2 * math.pi * 1e4 ** (12 / 32) == pytest.approx(198.69, abs=0.01)
    assert critical_dim(1e4, 32, 128) == 5 == first_pair_reaching(1e4, 32, 128) - 1


@pytest.mark.parametrize(
    ("theta", "d", "length"),
    [(1e4, 32, 64), (1e4, 32, 128), (1e4, 96, 4096), (5e5, 128, 8192), (1e6, 128, 32768), (2.5e4, 64, 2048)],
)
def test_critical_dim_is_the_pair_before_the_first_period_reaching_l0(theta, d, length):
    """ceil(x) is the least integer i >= x = log_theta(L0/2pi) d/2, and period_i >= L0 exactly when i >= x."""
    assert critical_dim(theta, d, length) == first_pair_reaching(theta, d, length) - 1


def test_critical_dim_is_clipped_to_the_pairs():
    assert critical_dim(1e4, 32, 4) == 0  # L0 < 2pi: even pair 0 (period 2pi) reaches it; ceil(-0.78) - 1 = -1
    assert critical_dim(10.0, 8, 100_000) == 4  # every period is below L0: ceil(16.8) - 1, clipped to d/2


def test_pair_periods():
    periods = pair_periods(1e4, 32)
    assert len(periods) == 16 and periods[0] == pytest.approx(2 * math.pi)
    assert periods[8] == pytest.approx(2 * math.pi * 100.0)  # theta^(2*8/32) = sqrt(1e4)
    assert all(b / a == pytest.approx(1e4 ** (2 / 32)) for a, b in itertools.pairwise(periods))


# ---- the space an optimizer asks in ----


def longrope2(**fields) -> SearchConfig:
    small = {"population": 16, "parents": 8, "mutations": 6, "crossovers": 6, "generations": 4}
    return SearchConfig.model_validate({"space": "longrope2", **small, **fields})


def seeds_for(settings: SearchConfig) -> list[Seed]:
    """PI, NTK and YaRN (which all project to the packed S, S + 0.01, ... at this scale, where only the top pair has
    room to move), and a seed spread over [S, length_scale] that lets the critical pair move from the start."""
    d, top = settings.critical_dim, settings.length_scale or 2 * SCALE
    return [*problem().seeds, Seed("spread", np.concatenate([np.ones(d), np.linspace(SCALE, top, PAIRS - d)]))]


def drive(settings: SearchConfig, rounds: int | None = None) -> tuple[object, list[Genome]]:
    """Ask and tell until the optimizer stops or `rounds` asks are told (steady: three children at a time); the
    genomes asked for, as the GA holds them while they are out."""
    optimizer = make_searcher(settings, pairs=PAIRS, scale=SCALE, seeds=seeds_for(settings))
    asked: list[Genome] = []
    while not optimizer.done() and (rounds is None or rounds > 0):
        candidates = optimizer.ask(3)
        assert candidates, "the optimizer ran out of new candidates"
        asked += [optimizer.pending[c.key] for c in candidates]
        optimizer.tell([result_of(c, objective(c.factors)) for c in candidates])
        rounds = None if rounds is None else rounds - 1
    return optimizer, asked


def check_in_space(factors: np.ndarray, d: int, length_scale: float) -> None:
    """The LongRoPE2 constraints on one factor vector, with the low pairs recomputed here from the critical pair."""
    searched = factors[d:]
    assert searched.min() >= SCALE - 1e-12 and searched.max() <= length_scale + 1e-12, "within [S, length_scale]"
    assert np.all(np.diff(searched) > 0), "strictly increasing"
    assert searched[-1] - searched[-2] <= 4.0 + 1e-9, "last pair at most previous + 4"
    np.testing.assert_allclose(searched * 100, np.round(searched * 100), atol=1e-6)  # the 0.01 grid
    assert factors[:d].tolist() == [factors[d] ** (i / d) for i in range(d)], "lambda_i = lambda_cd^(i/d_cd), exact"


@pytest.mark.parametrize("schedule", ["generational", "steady"])
@pytest.mark.parametrize(("d", "length_scale"), [(5, None), (12, 12.0), (0, 5.0)])
def test_every_asked_genome_is_in_the_space(schedule, d, length_scale):
    """(12, 12.0): four searched pairs within [4, 12], so the +4 cap can bind; (0, 5.0): every pair searched."""
    settings = longrope2(schedule=schedule, critical_dim=d, length_scale=length_scale, seed=7)
    optimizer, asked = drive(settings)
    grid = optimizer.grid
    assert len(asked) == len({g.key for g in asked}) >= settings.population
    for genome in asked:
        assert grid.is_valid(genome)
        check_in_space(grid.factors(genome), d, length_scale or 2 * SCALE)
        low_steps = [round((genome.factor_steps[d] * 0.01) ** (i / d) / 0.01) for i in range(d)]
        assert list(genome.factor_steps[:d]) == low_steps, "low pairs' steps: a function of the critical pair"
    if d:
        assert len({g.factor_steps[d] for g in asked}) > 1, "the critical pair is searched"


def test_identical_searched_parts_give_identical_keys_and_other_low_steps_are_invalid():
    optimizer = make_searcher(longrope2(critical_dim=5), pairs=PAIRS, scale=SCALE, seeds=problem().seeds)
    grid = optimizer.grid
    genome = grid.genome(np.linspace(1.0, 7.0, PAIRS))
    again = grid.genome(np.concatenate([np.full(5, 3.0), np.linspace(1.0, 7.0, PAIRS)[5:]]))
    assert again.key == genome.key
    tampered = Genome((genome.factor_steps[0] + 1, *genome.factor_steps[1:]))
    assert not grid.is_valid(tampered)


def test_state_round_trips_in_longrope2():
    settings = longrope2(critical_dim=5, seed=3)
    optimizer, _ = drive(settings, rounds=3)
    restored = make_searcher(settings, pairs=PAIRS, scale=SCALE, seeds=seeds_for(settings))
    restored.load_state(json.loads(optimizer.state().model_dump_json()))
    assert [c.key for c in restored.ask(3)] == [c.key for c in optimizer.ask(3)]


@pytest.mark.parametrize(("d", "length_scale"), [(5, None), (12, 12.0), (0, 5.0)])
def test_a_steady_state_resumes_from_the_recorded_factors_in_longrope2(d, length_scale):
    """state.json keeps no told genomes: a resume rebuilds each from its recorded factors (6 decimals),
    here where the pairs below the critical one are lambda_cd^(i/d_cd) and off the grid, and each must give its
    key back; the state then is the one the search held."""
    settings = longrope2(schedule="steady", critical_dim=d, length_scale=length_scale, seed=7)
    optimizer = make_searcher(settings, pairs=PAIRS, scale=SCALE, seeds=seeds_for(settings))
    records = []
    for _ in range(6):
        results = [result_of(c, objective(c.factors)) for c in optimizer.ask(3)]
        optimizer.tell(results)
        records += [r.model_copy(update={"factors": recorded_factors(r.factors)}) for r in results]
    restored = make_searcher(settings, pairs=PAIRS, scale=SCALE, seeds=seeds_for(settings))
    restored.resume(json.loads(optimizer.stored_state().model_dump_json()), records)
    assert restored.state() == optimizer.state() and optimizer.state().told


def test_genomes_outside_the_space_are_invalid():
    """Four searched pairs (12..15) within [4, 12]; the pairs below derived from pair 12."""
    grid = make_searcher(longrope2(critical_dim=12, length_scale=12.0), pairs=PAIRS, scale=SCALE, seeds=[]).grid

    def genome(searched: list[int]) -> Genome:
        return Genome(tuple(grid.derive([0] * 12 + searched)))

    assert grid.is_valid(genome([400, 500, 600, 1000]))
    assert not grid.is_valid(genome([400, 500, 600, 1001])), "last pair more than 4 above the previous"
    assert not grid.is_valid(genome([400, 500, 500, 600])), "not strictly increasing"
    assert not grid.is_valid(genome([399, 500, 600, 700])), "below S"
    assert not grid.is_valid(genome([400, 500, 900, 1201])), "above length_scale"


# ---- seeds projected into the space ----


def test_pi_seed_projects_by_hand():
    """PI: every pair 4.0 = S. Searched pairs 5..15 clip to >= 4.00 and must increase: 4.00, 4.01, ..., 4.10;
    the pairs below follow from 4.00: 4^(i/5)."""
    optimizer = make_searcher(longrope2(critical_dim=5), pairs=PAIRS, scale=SCALE, seeds=problem().seeds)
    pi = optimizer.grid.from_seed(problem().seeds[0])
    factors = optimizer.grid.factors(pi)
    np.testing.assert_allclose(factors[5:], 4.0 + 0.01 * np.arange(11), atol=1e-12)
    assert factors[:5].tolist() == [4.0 ** (i / 5) for i in range(5)]


@pytest.mark.parametrize(("d", "length_scale"), [(5, None), (3, 4.2), (12, 12.0)])
def test_every_seed_lands_in_the_space_and_starts_the_search(d, length_scale):
    settings = longrope2(critical_dim=d, length_scale=length_scale)
    optimizer = make_searcher(settings, pairs=PAIRS, scale=SCALE, seeds=problem().seeds)
    first = optimizer.ask(1)
    for seed in problem().seeds:  # pi, ntk, yarn
        genome = optimizer.grid.from_seed(seed)
        assert optimizer.grid.is_valid(genome), seed.name
        check_in_space(optimizer.grid.factors(genome), d, length_scale or 2 * SCALE)
        assert genome.key in {g.key for g in first}, seed.name


def test_projection_caps_the_last_pair_and_clips_to_length_scale():
    optimizer = make_searcher(
        longrope2(critical_dim=12, length_scale=30.0), pairs=PAIRS, scale=SCALE, seeds=problem().seeds
    )
    wide = np.concatenate([np.ones(12), [5.0, 6.0, 7.0, 25.0]])
    np.testing.assert_allclose(optimizer.grid.factors(optimizer.grid.genome(wide))[12:], [5.0, 6.0, 7.0, 11.0])
    above = np.full(PAIRS, 50.0)  # above length_scale: the searched pairs take the top of the grid
    np.testing.assert_allclose(optimizer.grid.factors(optimizer.grid.genome(above))[12:], [29.97, 29.98, 29.99, 30.0])


# ---- resolving the space, and its bad values ----


def test_resolve_space_defaults():
    # known_problem's shape: theta 1e4, d 32, L0 64: log(64/2pi)/log(1e4) * 16 = 4.03 -> d_cd 4; length_scale 2 x 4
    space = resolve_space(longrope2(), pairs=PAIRS, scale=SCALE, rope_theta=1e4, rotary_dim=32, original_length=64)
    assert space == SearchSpace("longrope2", critical_dim=4, low=400, high=800, cap=400)
    given = resolve_space(
        longrope2(critical_dim=9, length_scale=6.5),
        pairs=PAIRS,
        scale=SCALE,
        rope_theta=1e4,
        rotary_dim=32,
        original_length=64,
    )
    assert (given.critical_dim, given.low, given.high) == (9, 400, 650)
    longrope = resolve_space(
        SearchConfig(), pairs=PAIRS, scale=SCALE, rope_theta=1e4, rotary_dim=32, original_length=64
    )
    assert (longrope.kind, longrope.critical_dim, longrope.low, longrope.high) == ("longrope", 0, 100, 500)


def test_make_searcher_takes_the_resolved_critical_dim():
    optimizer = make_searcher(longrope2(), pairs=PAIRS, scale=SCALE, seeds=problem().seeds, critical_dim=4)
    assert optimizer.grid.critical_dim == 4 and list(optimizer.grid.searched_pairs) == list(range(4, PAIRS))
    with pytest.raises(ValueError, match=r"^search\.critical_dim: "):
        make_searcher(longrope2(), pairs=PAIRS, scale=SCALE, seeds=problem().seeds)  # nobody resolved it


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"critical_dim": 16}, "search.critical_dim: must be < 16 pairs, got 16"),
        ({"critical_dim": 5, "length_scale": 3.0}, "search.length_scale: must be >= target/original (4), got 3"),
        # 16 pairs searched from 4.00 strictly on the 0.01 grid need 4.00 .. 4.15
        ({"critical_dim": 0, "length_scale": 4.1}, "search.length_scale: must be >= 4.15 for the 16 searched pairs"),
        ({"critical_dim": 0, "length_scale": 4.1, "grid_step": 0.05}, "search.length_scale: must be >= 4.75 for"),
    ],
)
def test_impossible_spaces_name_the_field(fields, message):
    with pytest.raises(ValueError, match="^" + message.replace(".", r"\.").replace("(", r"\(").replace(")", r"\)")):
        resolve_space(longrope2(**fields), pairs=PAIRS, scale=SCALE, rope_theta=1e4, rotary_dim=32, original_length=64)


def test_the_smallest_length_scale_is_enough():
    space = resolve_space(
        longrope2(critical_dim=0, length_scale=4.15),
        pairs=PAIRS,
        scale=SCALE,
        rope_theta=1e4,
        rotary_dim=32,
        original_length=64,
    )
    assert (space.low, space.high) == (400, 415)


def test_a_formula_past_the_last_pair_says_so():
    with pytest.raises(ValueError, match=r"^search\.critical_dim: must be < 4 pairs, got 4 \(the formula"):
        resolve_space(longrope2(), pairs=4, scale=SCALE, rope_theta=10.0, rotary_dim=8, original_length=100_000)


# ---- `longrope encodings critical-dim` ----


def test_cli_prints_the_critical_dim_and_the_periods_around_it(capsys):
    assert main(["encodings", "critical-dim", "--theta", "10000", "--head-dim", "32", "--original-length", "128"]) == 0
    out = capsys.readouterr().out
    assert "d_cd = 5" in out
    table = [line for line in out.splitlines() if line.endswith("L0") and line.split()[-4].isdigit()]
    rows = {int(line.split()[-4]): line for line in table}
    assert sorted(rows) == [3, 4, 5, 6, 7]
    for i, line in rows.items():
        period = 2 * math.pi * 1e4 ** (2 * i / 32)
        assert f"{period:.1f}" in line and ("<  L0" if period < 128 else ">= L0") in line
    assert rows[5].startswith(">")
    assert "pairs 5..15" in out


def test_cli_partial_rotary_factor(capsys):
    # Phi-3-like head_dim 96 x 0.75 = 72 rotary dims: log(4096/2pi)/log(1e4) * 36 = 25.3 -> 25
    argv = ["--theta", "1e4", "--head-dim", "96", "--original-length", "4096", "--partial-rotary-factor", "0.75"]
    assert main(["encodings", "critical-dim", *argv]) == 0
    assert "d_cd = 25" in capsys.readouterr().out and critical_dim(1e4, 72, 4096) == 25


GOOD = {"--theta": "1e4", "--head-dim": "32", "--original-length": "128"}


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--theta", "1", "must be greater than 1, got 1.0"),
        ("--theta", "0.5", "must be greater than 1, got 0.5"),
        ("--head-dim", "31", "must be even and at least 2, got 31"),
        ("--head-dim", "0", "must be greater than 0, got 0"),
        ("--original-length", "1", "must be >= 2 tokens, got 1"),
        ("--partial-rotary-factor", "0", "must be greater than 0, got 0.0"),
        ("--partial-rotary-factor", "0.03", "head_dim 32 x 0.03 gives rotary dim 0; it must be even and at least 2"),
    ],
)
def test_cli_bad_values_one_line_exit_2(capsys, flag, value, message):
    argv = [item for name, good in {**GOOD, flag: value}.items() for item in (name, good)]
    assert main(["encodings", "critical-dim", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"longrope: error: {flag}: {message}") and captured.err.count("\n") == 1
