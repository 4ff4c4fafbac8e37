"""Gradient descent on the factors and the hybrid polish, on the cheap known objective (no model): the
parametrization against the constraints and against finite differences, the descent's records and cost counts,
data-parallel chunks, exact resume after a crash at every point, and bad `search.gradient` values."""

from __future__ import annotations

import contextlib
import json
import math

import numpy as np
import pytest
from cli_checks import cli_error_line
from known_problem import OPTIMUM, TARGET, objective, problem, window_nll_gradient
from search_helpers import FunctionEvaluator, make_coordinator, replayed_state, write_job_record

from longrope.search.cli.main import main
from longrope.search.config.search_section import GradientConfig
from longrope.search.optimizers.descent_space import Parametrization
from longrope.search.optimizers.factory import load_job_config
from longrope.search.optimizers.genome import Genome
from longrope.search.optimizers.objective import ObjectiveMix, objective_gradient, subset_mix
from longrope.search.run.run_check import read_run
from longrope.search.run.run_store import RunDir

WINDOWS = 4


def job(run_dir, *overrides: str):
    settings = ["target_length=256", f"data.search_windows={WINDOWS}", "search.seed=3", f"output_dir={run_dir}"]
    return load_job_config(None, [*settings, "search.optimizer=gradient", "search.gradient.steps=12", *overrides])


def run(config, run_dir, evaluator=None, *, resume=False):
    store = RunDir(run_dir)
    if not resume:
        store.create(config)
    coordinator = make_coordinator(config, store, evaluator or smooth(), problem(WINDOWS), resume=resume)
    return coordinator.run(), coordinator


def smooth(**kwargs) -> FunctionEvaluator:
    """The cheap objective without its wobble: the wobble is a sine of 1000 x sum(factors), whose slope (2 per
    unit factor) would swamp the objective's, so a descent on it measures the noise, not the objective."""
    return FunctionEvaluator(windows=kwargs.pop("windows", WINDOWS), wobble=0.0, **kwargs)


def history(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]


# ---- the parametrization ----


@pytest.mark.parametrize("attention", [None, (1.0, 1.6)])
def test_every_parameter_vector_gives_factors_within_the_constraints(attention):
    """Property: any u, tame or extreme, maps to non-decreasing factors in [1, max_factor] and an attention factor
    within its bounds (2,000 draws at scales from 0.01 to 100)."""
    param = Parametrization(16, 5.0, attention)
    rng = np.random.default_rng(0)
    for draw in range(2000):
        u = rng.normal(size=param.size) * 10.0 ** rng.uniform(-2, 2)
        factors = param.factors(u)
        assert np.all(np.diff(factors) >= 0) and factors[0] >= 1.0 and factors[-1] <= 5.0 + 1e-12, draw
        if attention:
            assert attention[0] <= param.attention_factor(u) <= attention[1]


@pytest.mark.parametrize("attention", [None, (1.0, 1.6)])
def test_the_pullback_is_the_gradient_of_the_composed_map(attention):
    """d (g . factors(u) + h a(u)) / d u by the closed form against central finite differences."""
    param = Parametrization(16, 5.0, attention)
    rng = np.random.default_rng(1)
    u, g, h = rng.normal(size=param.size), rng.normal(size=16), 0.7

    def loss(v):
        return float(g @ param.factors(v)) + (h * param.attention_factor(v) if attention else 0.0)

    numeric = np.array([(loss(u + e) - loss(u - e)) / 2e-6 for e in np.eye(param.size) * 1e-6])
    assert np.allclose(param.pullback(u, g, h), numeric, atol=1e-6)


def test_a_seed_is_the_start_it_names():
    """inverse then forward gives the seed back: NTK's rising factors exactly (every increment above the floor),
    PI's flat 4s and YaRN's flat ends with each zero increment raised to the floor (half a 0.01 grid step), so off
    by at most 16 floors."""
    param = Parametrization(16, 5.0, (1.0, 1.6), 0.005)
    for seed in problem().seeds:
        factors = param.factors(param.inverse(seed.factors, 1.21))
        flat = int(np.sum(np.diff(np.concatenate([[1.0], seed.factors])) < 0.005))
        assert np.abs(factors - np.clip(seed.factors, 1, 5)).max() <= flat * 0.005 + 1e-9, seed.name
        assert param.attention_factor(param.inverse(seed.factors, 1.21)) == pytest.approx(1.21)


def test_the_step_gradient_is_the_mix_s_gradient():
    """objective_gradient against finite differences of ObjectiveMix.mean_nll when each window's NLL moves
    linearly with the parameters (two objectives with weights 1 and 3, unequal token counts)."""
    mix = ObjectiveMix.of({"perplexity": 1.0, "needle": 3.0}, 3)
    rng = np.random.default_rng(2)
    base, grads, tokens = rng.uniform(5, 50, 6), rng.normal(size=(6, 4)), [100, 7, 100, 9, 100, 5]
    theta = rng.normal(size=4)

    def mean(t):
        return mix.mean_nll(list(base + grads @ t), tokens)

    numeric = np.array([(mean(theta + e) - mean(theta - e)) / 2e-6 for e in np.eye(4) * 1e-6])
    assert np.allclose(objective_gradient(mix, tokens, grads), numeric, atol=1e-7)
    assert subset_mix(mix, (2, 4)).objectives == ("perplexity", "needle")


# ---- descent on the cheap objective ----


def test_descent_improves_on_its_seeds_and_records_every_step(tmp_path):
    best, _ = run(job(tmp_path), tmp_path)
    records = history(tmp_path)
    seeds = [r for r in records if r["generation"] == 0]
    assert {r["seed"] for r in seeds} == {"pi", "ntk", "yarn"}
    steps = [r for r in records if "gradient" in r]
    assert steps and all(r["backward_windows"] == WINDOWS - 2 and r["gradient_windows"] == [0, 2] for r in steps)
    assert best.mean_nll < min(r["mean_nll"] for r in seeds), "descent beats the best seed"
    rounded = records[-1]
    assert "gradient" not in rounded and np.allclose(
        np.round(np.array(rounded["factors"]) / 0.01) * 0.01, rounded["factors"]
    )
    assert all(np.all(np.diff(r["factors"]) >= 0) for r in records), "every point is monotone"
    lines = (tmp_path / "history.jsonl").read_text().splitlines()
    assert len(lines) == len({json.loads(line)["key"] for line in lines}), "no point scored twice"
    first_step = steps[0]
    best_seed = min(seeds, key=lambda r: r["mean_nll"])["factors"]
    assert first_step["factors"] == pytest.approx(best_seed, abs=0.005 + 1e-6), "from the best seed, within a floor"


def test_the_recorded_gradient_is_the_objective_s_on_the_step_windows(tmp_path):
    """A step's recorded gradient (d mean NLL over its gradient windows / d factors) against the cheap objective's
    hand-derived gradient, averaged over those windows (one token each)."""
    run(job(tmp_path, "search.gradient.steps=2"), tmp_path, smooth())
    step = next(r for r in history(tmp_path) if "gradient" in r)
    factors = np.asarray(step["factors"])
    expected = np.mean([window_nll_gradient(factors, j, WINDOWS, 0.0) for j in range(2)], axis=0)
    assert np.allclose(step["gradient"], expected, rtol=1e-9)


@pytest.mark.parametrize("fail_on_call", [2, 4, 7, 10])
def test_a_crash_anywhere_resumes_to_the_uninterrupted_run(tmp_path, fail_on_call):
    """Killed after the first result of call k (a seed, a step's chunk, a late step), resumed: the same state,
    best and history keys as a run never stopped, and no window scored twice."""
    config = job(tmp_path / "clean", "search.gradient.steps=8")
    clean_best, _ = run(config, tmp_path / "clean")
    crashed = tmp_path / "crash"
    config = config.model_copy(update={"output_dir": str(crashed)})
    crashing = smooth(fail_on_call=fail_on_call)
    with pytest.raises(RuntimeError, match="simulated coordinator crash"):
        run(config, crashed, crashing)
    resumed = smooth()
    best, _ = run(config, crashed, resumed, resume=True)
    assert best == clean_best
    clean_state = json.loads((tmp_path / "clean" / "state.json").read_text())
    state = json.loads((crashed / "state.json").read_text())
    assert state["optimizer"] == clean_state["optimizer"] and state["progress"] == clean_state["progress"]
    assert [r["key"] for r in history(crashed)] == [r["key"] for r in history(tmp_path / "clean")]


def test_status_counts_forward_and_backward_window_passes(tmp_path, capsys):
    evaluator = smooth()
    run(job(tmp_path), tmp_path, evaluator)
    capsys.readouterr()
    assert main(["status", "--json", str(tmp_path)]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["forward_windows"] == evaluator.window_evaluations
    assert status["backward_windows"] == evaluator.backward_windows > 0
    assert main(["status", str(tmp_path)]) == 0
    assert (
        f"({evaluator.window_evaluations} forward and {evaluator.backward_windows} backward" in capsys.readouterr().out
    )


def test_held_out_windows_stop_a_descent_that_no_longer_gains(tmp_path):
    """With a learning rate far too large the held-out NLL stops improving; patience 2 ends the descent early,
    and the last generation is still the best point rounded to the grid."""
    config = job(tmp_path, "search.gradient.steps=40", "search.gradient.patience=2", "search.gradient.learning_rate=5")
    run(config, tmp_path)
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["finished"] and state["stopped_early"]
    descent = replayed_state(config, RunDir(tmp_path), WINDOWS)
    assert state["progress"]["generation"] == descent["generation"] < 42
    assert descent["descent"]["rounded"]


# ---- hybrid ----


def hybrid(run_dir, *overrides: str):
    return load_job_config(
        None,
        [
            "target_length=256",
            f"data.search_windows={WINDOWS}",
            "search.seed=3",
            "search.optimizer=hybrid",
            "search.population=16",
            "search.parents=8",
            "search.mutations=4",
            "search.crossovers=4",
            "search.generations=4",
            "search.gradient.polish_every=2",
            "search.gradient.polish_steps=3",
            f"output_dir={run_dir}",
            *overrides,
        ],
    )


def test_hybrid_polishes_every_k_generations_and_adopts_the_result(tmp_path):
    config = hybrid(tmp_path)
    best, _ = run(config, tmp_path)
    records = history(tmp_path)
    steps = [r for r in records if "gradient" in r]
    assert len(steps) == 2 * 3, "polished after generations 2 and 4, 3 steps each"
    assert json.loads((tmp_path / "state.json").read_text())["optimizer"] == {"kind": "hybrid", "state": None}
    state = replayed_state(config, RunDir(tmp_path), WINDOWS)
    assert state["polished_through"] == 4 and state["polish"] is None
    told = {Genome.from_json(genome).key for genome, _ in state["evolution"]["told"]}
    after_polish = [
        records[k + 1]["key"]
        for k, r in enumerate(records[:-1])
        if "gradient" in r and "gradient" not in records[k + 1]
    ]
    # a polish whose result on the grid was scored before (a GA child already) adds no line: at least the first adds one
    assert after_polish and set(after_polish) <= told, "each polish's result on the grid is a GA child"
    assert best.mean_nll <= min(r["mean_nll"] for r in records if r["mean_nll"] is not None)


def polish_runs(records: list[dict]) -> list[int]:
    """The lengths of the runs of consecutive polish-step lines (lines with a gradient) in history order."""
    runs, length = [], 0
    for record in records:
        if "gradient" in record:
            length += 1
        elif length:
            runs, length = [*runs, length], 0
    return [*runs, length] if length else runs


def test_hybrid_polishes_its_final_best_when_the_last_generation_is_no_multiple(tmp_path):
    """polish_every 3 in 4 generations: after generation 3, and after 4 (the last) although 4 is no multiple."""
    config = hybrid(tmp_path, "search.gradient.polish_every=3")
    run(config, tmp_path)
    assert json.loads((tmp_path / "state.json").read_text())["finished"]
    assert replayed_state(config, RunDir(tmp_path), WINDOWS)["polished_through"] == 4
    assert polish_runs(history(tmp_path)) == [3, 3]


def test_hybrid_with_polish_every_null_polishes_the_final_best_only(tmp_path):
    run(hybrid(tmp_path, "search.gradient.polish_every=null"), tmp_path)
    records = history(tmp_path)
    assert polish_runs(records) == [3]
    first_step = next(k for k, r in enumerate(records) if "gradient" in r)
    assert first_step == 16 + 4 * (4 + 4), "the polish starts after every GA child of generations 0-4 is scored"


def test_hybrid_stopped_early_still_polishes_its_final_best(tmp_path):
    """Early stop after generation 1 (no gain of 10 nats can happen): the run ends with one polish of its best,
    and state.json says finished only after it."""
    config = hybrid(tmp_path, "search.early_stop.patience=1", "search.early_stop.min_improvement=10")
    run(config, tmp_path)
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["stopped_early"] and state["finished"]
    assert replayed_state(config, RunDir(tmp_path), WINDOWS)["polished_through"] == 1
    assert polish_runs(history(tmp_path)) == [3]


@pytest.mark.parametrize("fail_on_call", [3, 4])
def test_hybrid_stopped_early_resumes_into_its_final_polish(tmp_path, fail_on_call):
    """Calls: generations 0-1 (1-2, the early stop after 2), the final polish's steps (3-5): a kill in it is not
    a finished run; the resumed run polishes to the uninterrupted run's lines."""
    overrides = ("search.early_stop.patience=1", "search.early_stop.min_improvement=10")
    clean_best, _ = run(hybrid(tmp_path / "clean", *overrides), tmp_path / "clean")
    crashed = tmp_path / "crash"
    config = hybrid(crashed, *overrides)
    with pytest.raises(RuntimeError, match="simulated coordinator crash"):
        run(config, crashed, smooth(fail_on_call=fail_on_call))
    assert not json.loads((crashed / "state.json").read_text())["finished"]
    best, _ = run(config, crashed, resume=True)
    assert best == clean_best
    assert [r["key"] for r in history(crashed)] == [r["key"] for r in history(tmp_path / "clean")]


@pytest.mark.parametrize(("fail_on_call", "probes"), [(3, 1), (5, 1), (7, 1), (12, 1), (5, 3), (6, 3), (11, 3)])
def test_hybrid_resumes_exactly_mid_polish(tmp_path, fail_on_call, probes):
    """Calls: generations 0-2 (1-3), the first polish's steps (4-6) and rounding (7), generations 3-4 (8-9), the
    second polish (10-13): killed in a generation, in a polish step and at a polish's rounding; with 3 line-search
    trials a step, killed after the first of a step's trials landed."""
    config = hybrid(tmp_path / "clean", f"search.gradient.polish_probes={probes}")
    clean_best, _ = run(config, tmp_path / "clean")
    crashed = tmp_path / "crash"
    config = config.model_copy(update={"output_dir": str(crashed)})
    with pytest.raises(RuntimeError, match="simulated coordinator crash"):
        run(config, crashed, smooth(fail_on_call=fail_on_call))
    best, _ = run(config, crashed, resume=True)
    assert best == clean_best
    assert [r["key"] for r in history(crashed)] == [r["key"] for r in history(tmp_path / "clean")]
    clean_state = json.loads((tmp_path / "clean" / "state.json").read_text())
    state = json.loads((crashed / "state.json").read_text())
    assert state["optimizer"] == clean_state["optimizer"] and state["progress"] == clean_state["progress"]


# ---- bad search.gradient values ----


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("search.gradient.steps=-1", "search.gradient.steps = -1: Input should be greater than or equal to 0"),
        ("search.gradient.learning_rate=0", "search.gradient.learning_rate = 0: Input should be greater than 0"),
        ("search.gradient.holdout_windows=8", "search.gradient.holdout_windows: must leave the gradient at least one"),
        ("search.gradient.windows_per_step=7", "search.gradient.windows_per_step: at most the 6 gradient windows"),
        ("search.gradient.polish_every=0", "search.gradient.polish_every = 0: Input should be greater than or equal"),
        ("search.gradient.lr=0.1", "search.gradient.lr: unknown field"),
        (
            "search.n_hat.enabled=true",
            "search.n_hat.enabled: searching n_hat needs optimizer 'dim_mono', got 'gradient'",
        ),
        ("search.space=longrope2", "search.space: 'longrope2' needs optimizer 'dim_mono', got 'gradient'"),
        ("search.gradient.patience=0", "search.gradient.patience = 0: Input should be greater than or equal to 1"),
    ],
)
def test_bad_gradient_settings_are_one_line(override, expected, tmp_path, capsys, caplog):
    config = tmp_path / "c.yaml"
    config.write_text(f"target_length: 1024\noutput_dir: {tmp_path / 'out'}\nsearch: {{optimizer: gradient}}\n")
    line = cli_error_line(["validate", str(config), "--set", override], capsys, caplog, folder=tmp_path)
    assert expected in line


def test_objective_helpers_stay_consistent_with_the_cheap_objective():
    """The hand-derived gradient of the test objective against its finite difference (the reference the
    recorded-gradient test relies on)."""
    factors = OPTIMUM * 1.1
    numeric = np.array([(objective(factors + e) - objective(factors - e)) / 2e-6 for e in np.eye(len(factors)) * 1e-6])
    assert np.allclose(window_nll_gradient(factors, 0, 1, 0.0)[:-1], numeric, atol=1e-8)
    assert math.isfinite(objective(factors))


@pytest.mark.parametrize(
    ("every", "generations", "polishes"),
    [(5, 20, 4), (3, 20, 7), (None, 20, 1), (20, 20, 1), (30, 20, 1), (5, 0, 0), (1, 3, 3)],
)
def test_polish_count_by_hand(every, generations, polishes):
    """after generations 5, 10, 15, 20 | 3, 6, ..., 18 and the last, 20 | the last only | ... | none in a run
    without generations | after each of 3."""
    assert GradientConfig(polish_every=every).polishes(generations) == polishes


@pytest.mark.parametrize("optimizer", ["gradient", "hybrid"])
def test_a_run_killed_anywhere_reads_cleanly(tmp_path, optimizer):
    """The replay check of a descent's state (run_check) refuses no state a run writes: killed
    after the first result of every evaluator call (seeds, each step's chunks, the rounding; a hybrid's
    generations and its two polishes, attention factor searched), every run directory reads as sound."""
    extra = ["search.attention_factor.mode=searched", "search.gradient.windows_per_step=1"]
    calls = 16 if optimizer == "gradient" else 15
    for fail_on_call in range(1, calls):
        run_dir = tmp_path / str(fail_on_call)
        config = (job if optimizer == "gradient" else hybrid)(run_dir, *extra, "search.gradient.steps=6")
        RunDir(run_dir).create(config)
        write_job_record(run_dir, config, search_windows={"count": WINDOWS, "tokens": TARGET + 1})
        coordinator = make_coordinator(config, RunDir(run_dir), smooth(fail_on_call=fail_on_call), problem(WINDOWS))
        with contextlib.suppress(RuntimeError):  # the simulated crash; past the last call the run finishes
            coordinator.run()
        read_run(RunDir(run_dir))
