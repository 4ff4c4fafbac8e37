"""search.surrogate: the GA's children screened by a ridge surrogate before scoring, on the known
problem (no model): the ridge fit against a second formulation and a function worked by hand, the screening
against a surrogate fitted by hand, the counts status and the log give, determinism, exact resume after a crash
anywhere, and bad values."""

from __future__ import annotations

import json

import numpy as np
import pytest
from known_problem import PAIRS, TARGET, objective, problem
from search_helpers import FunctionEvaluator, make_coordinator, result_of, write_job_record

from longrope.search.cli.main import main
from longrope.search.config.search_section import SearchConfig
from longrope.search.config.strict import JobConfigError
from longrope.search.optimizers.factory import load_job_config, make_searcher, search_plan
from longrope.search.optimizers.screening import bred_children, scored_children
from longrope.search.optimizers.surrogate import GaussianProcessSurrogate, RidgeSurrogate, random_share, screen
from longrope.search.run.reporting import SilentReporter
from longrope.search.run.run_check import read_run
from longrope.search.run.run_store import RunDir

WINDOWS = 2


def job(run_dir, *overrides: str):
    settings = [
        "target_length=256",
        f"data.search_windows={WINDOWS}",
        "search.seed=4",
        "search.seeds=[pi, ntk, yarn]",  # the paper's three, not the tuned grids: the counts are worked for them
        "search.population=12",
        "search.parents=6",
        "search.mutations=4",
        "search.crossovers=4",
        "search.generations=6",
        "search.surrogate.enabled=true",
        "search.surrogate.proposals=4",
        f"output_dir={run_dir}",
    ]
    return load_job_config(None, [*settings, *overrides])


class LineRecorder(SilentReporter):
    """A reporter that keeps the lines the coordinator logs."""

    def __init__(self):
        self.lines: list[str] = []

    def log(self, line: str) -> None:
        self.lines.append(line)


def run(config, run_dir, evaluator=None, *, resume=False, reporter=None):
    store = RunDir(run_dir)
    if not resume:
        store.create(config)
        write_job_record(run_dir, config, search_windows={"count": WINDOWS, "tokens": TARGET + 1})
    evaluator = evaluator or FunctionEvaluator(windows=WINDOWS)
    options = {"reporter": reporter} if reporter else {}
    coordinator = make_coordinator(config, store, evaluator, problem(WINDOWS), resume=resume, **options)
    return coordinator.run(), coordinator


def history(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]


# ---- the ridge fit ----


def test_ridge_equals_least_squares_on_the_augmented_system():
    """Ridge is ordinary least squares on [Z; sqrt(ridge) I] against [y - mean(y); 0] (a second formulation),
    Z the standardized features; more features than points, as in the first generations."""
    rng = np.random.default_rng(0)
    features, scores = rng.normal(size=(12, 20)), rng.normal(size=12)
    surrogate = RidgeSurrogate.fit(features, scores, ridge=0.7)
    z = (features - features.mean(axis=0)) / features.std(axis=0)
    augmented = np.vstack([z, np.sqrt(0.7) * np.eye(20)])
    target = np.concatenate([scores - scores.mean(), np.zeros(20)])
    weights = np.linalg.lstsq(augmented, target, rcond=None)[0]
    fresh = rng.normal(size=(5, 20))
    expected = ((fresh - features.mean(axis=0)) / features.std(axis=0)) @ weights + scores.mean()
    np.testing.assert_allclose(surrogate.predict(fresh), expected, rtol=1e-9, atol=1e-12)


def test_ridge_with_a_tiny_penalty_recovers_a_linear_function_worked_by_hand():
    """y = 3 + 2 a - b on four points; a constant third feature is ignored (its scale set to 1, weight 0).
    At (a, b) = (10, -1): 3 + 20 + 1 = 24."""
    features = np.array([[0.0, 0.0, 5.0], [1.0, 0.0, 5.0], [0.0, 1.0, 5.0], [2.0, 3.0, 5.0]])
    scores = 3 + 2 * features[:, 0] - features[:, 1]
    surrogate = RidgeSurrogate.fit(features, scores, ridge=1e-10)
    assert surrogate.predict(np.array([[10.0, -1.0, 5.0]]))[0] == pytest.approx(24.0, abs=1e-6)
    assert surrogate.weights[2] == 0.0


# ---- the screening rule ----


def test_screen_keeps_the_best_predicted_in_proposal_order():
    """Predictions 5, 1, 3, 2, 4: the best two are proposals 1 and 3; the best four 1, 3, 2, 4 (sorted)."""
    predicted = np.array([5.0, 1.0, 3.0, 2.0, 4.0])
    rng = np.random.default_rng(0)
    assert screen(predicted, 2, 0.0, rng) == [1, 3]
    assert screen(predicted, 4, 0.0, rng) == [1, 2, 3, 4]
    assert screen(predicted, 9, 0.0, rng) == [0, 1, 2, 3, 4]


def test_screen_draws_its_exploration_share_from_the_screened_out():
    """keep 4 at exploration 0.25: 3 best (1, 3, 2) and 1 drawn from {4, 0}; over many generators both are
    drawn. Shares round half up: 0.25 x 2 = 0.5 -> 1, 0.2 x 4 = 0.8 -> 1, 0.1 x 4 = 0.4 -> 0."""
    predicted = np.array([5.0, 1.0, 3.0, 2.0, 4.0])
    drawn = set()
    for seed in range(50):
        picked = screen(predicted, 4, 0.25, np.random.default_rng(seed))
        assert {1, 2, 3} <= set(picked) and len(picked) == 4
        drawn |= set(picked) - {1, 2, 3}
    assert drawn == {0, 4}
    assert (random_share(2, 0.25), random_share(4, 0.2), random_share(4, 0.1), random_share(3, 1.0)) == (1, 1, 0, 3)


def test_a_generation_scores_the_children_a_surrogate_fitted_by_hand_ranks_best():
    """After generation 0 is told, generation 1 scores half its 6 children and proposes 4 x 3; a ridge fitted here
    (features by hand: log factors, their squares, attention factor 0, n_hat; the augmented least-squares
    formulation) on the 12 told points ranks them, and its best 3 are exactly the children asked."""
    settings = SearchConfig(
        population=12, parents=6, mutations=3, crossovers=3, seed=2, surrogate={"enabled": True, "proposals": 4}
    )
    settings = settings.model_copy(update={"surrogate": settings.surrogate.model_copy(update={"exploration": 0.0})})
    evolution = make_searcher(settings, pairs=PAIRS, scale=4.0, seeds=problem().seeds)
    told = evolution.ask(1)
    evolution.tell([result_of(c, objective(c.factors)) for c in told])
    asked = evolution.ask(1)
    proposals = [evolution.grid.candidate(g, 1, None) for g in evolution.screen.last_proposals]
    assert len(proposals) == 4 * 3 and len(asked) == 3

    def by_hand(candidates):
        logs = np.log(np.stack([c.factors for c in candidates]))
        return np.hstack([logs, logs**2, np.zeros((len(candidates), 2))])

    train, scores = by_hand(told), np.array([objective(c.factors) for c in told])
    mean, scale = train.mean(axis=0), train.std(axis=0)
    scale[scale < 1e-12] = 1.0
    z = (train - mean) / scale
    augmented = np.vstack([z, np.eye(z.shape[1])])  # ridge 1.0, the default
    weights = np.linalg.lstsq(augmented, np.concatenate([scores - scores.mean(), np.zeros(z.shape[1])]), rcond=None)[0]
    predicted = ((by_hand(proposals) - mean) / scale) @ weights
    best = {proposals[i].key for i in np.argsort(predicted, kind="stable")[:3]}
    assert {c.key for c in asked} == best
    assert (evolution.progress().proposed, evolution.progress().screened_out) == (12, 9)


# ---- a run: counts, determinism, resume ----


def test_status_and_the_log_count_what_was_screened(tmp_path, capsys):
    """proposed - screened_out is exactly the children scored after generation 0 (history's own count)."""
    recorder = LineRecorder()
    run(job(tmp_path), tmp_path, reporter=recorder)
    assert main(["status", "--json", str(tmp_path)]) == 0
    status = json.loads(capsys.readouterr().out)
    children = sum(1 for r in history(tmp_path) if r["generation"] > 0)
    assert status["proposed"] - status["screened_out"] == children == 6 * 4
    assert status["proposed"] == 4 * children  # every proposal unique on this problem
    assert (
        f"surrogate screened out {status['screened_out']} of {status['proposed']} children proposed"
        in (recorder.lines[-1])
    )
    generations = [line for line in recorder.lines if line.startswith("generation ")]
    assert "surrogate" not in generations[0] and "surrogate screened out 12 of 16 children" in generations[1]
    assert main(["status", str(tmp_path)]) == 0
    assert f"surrogate screened out {status['screened_out']} of {status['proposed']}" in capsys.readouterr().out


def test_a_run_costs_what_estimate_plans(tmp_path):
    """estimate's count (`search_plan`, what `longrope estimate` prints) is the candidates a screened run scores:
    12 + 6 generations x 4 (half of mutations + crossovers), the screened-out never scored; its words name the
    proposals."""
    config = job(tmp_path)
    run(config, tmp_path)
    plan = search_plan(config.search, 3)
    assert len(history(tmp_path)) == plan.candidates == 12 + 6 * 4
    assert "screened by the surrogate from 16 proposals" in plan.text


def test_off_by_default_and_then_status_says_null(tmp_path, capsys):
    run(job(tmp_path, "search.surrogate.enabled=false"), tmp_path)
    capsys.readouterr()
    assert main(["status", "--json", str(tmp_path)]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["proposed"], status["screened_out"]) == (None, None)
    assert SearchConfig().surrogate.enabled is False


def test_same_seed_same_run(tmp_path):
    run(job(tmp_path / "a"), tmp_path / "a")
    run(job(tmp_path / "b"), tmp_path / "b")
    assert history(tmp_path / "a") == history(tmp_path / "b")


@pytest.mark.parametrize("fail_on_call", [1, 2, 4, 6])
def test_a_crash_anywhere_resumes_to_the_uninterrupted_run(tmp_path, fail_on_call):
    """Killed after the first result of call k (generation 0, a screened generation, a late one), resumed: the
    same state (counts and generator included) and the same history keys as a run never stopped."""
    config = job(tmp_path / "clean")
    clean_best, _ = run(config, tmp_path / "clean")
    crashed = tmp_path / "crash"
    config = config.model_copy(update={"output_dir": str(crashed)})
    with pytest.raises(RuntimeError, match="simulated coordinator crash"):
        run(config, crashed, FunctionEvaluator(windows=WINDOWS, fail_on_call=fail_on_call))
    read_run(RunDir(crashed))  # a killed run's directory reads as sound
    best, _ = run(config, crashed, resume=True)
    assert best == clean_best
    clean_state = json.loads((tmp_path / "clean" / "state.json").read_text())
    state = json.loads((crashed / "state.json").read_text())
    assert state["optimizer"] == clean_state["optimizer"] and state["progress"] == clean_state["progress"]
    assert sorted(r["key"] for r in history(crashed)) == sorted(r["key"] for r in history(tmp_path / "clean"))


def test_the_hybrid_screens_its_evolution(tmp_path):
    config = job(
        tmp_path, "search.optimizer=hybrid", "search.gradient.polish_steps=2", "search.gradient.holdout_windows=1"
    )
    run(config, tmp_path)
    progress = json.loads((tmp_path / "state.json").read_text())["progress"]
    assert progress["proposed"] - progress["screened_out"] == 6 * 4


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("search.optimizer=cmaes", "search.surrogate.enabled"),
        ("search.optimizer=gradient", "search.surrogate.enabled"),
        ("search.surrogate.proposals=1", "search.surrogate.proposals"),
        ("search.surrogate.exploration=1.5", "search.surrogate.exploration"),
        ("search.surrogate.ridge=0", "search.surrogate.ridge"),
    ],
)
def test_bad_values_name_the_field(tmp_path, override, field):
    with pytest.raises(JobConfigError, match=field.replace(".", r"\.")):
        job(tmp_path, override)


def test_status_plot_draws_the_screened_run_beside_the_ga(tmp_path, monkeypatch, capsys):
    """`status A B --plot`: the screened run is an arm of its own on the axis, named with its proposals; its line
    ends at its own spend (12 + 6 x 4 candidates on 2 windows), the GA's at the GA's (12 + 6 x 8)."""
    from longrope.search.reports import progress_plot

    figures = []
    draw = progress_plot.plot_progress
    monkeypatch.setattr(progress_plot, "plot_progress", lambda *a, **k: figures.append(draw(*a, **k)) or figures[-1])
    run(job(tmp_path / "screened"), tmp_path / "screened")
    run(job(tmp_path / "ga", "search.surrogate.enabled=false"), tmp_path / "ga")
    png = tmp_path / "arms.png"
    assert main(["status", str(tmp_path / "screened"), str(tmp_path / "ga"), "--plot", str(png)]) == 0
    lines = [line for line in figures[0].axes[0].get_lines() if not line.get_label().startswith("_")]
    labels = [line.get_label() for line in lines]
    assert labels[0].startswith("longrope-search (dim_mono, surrogate 4x), ") and "(dim_mono), " in labels[1]
    assert [line.get_xdata()[-1] for line in lines] == [(12 + 6 * 4) * WINDOWS, (12 + 6 * 8) * WINDOWS]
    assert png.stat().st_size > 0


@pytest.mark.parametrize(
    ("mutations", "crossovers", "share", "proposals", "scored", "bred"),
    [(8, 8, 0.5, 4, 8, (16, 16)), (5, 3, 0.5, 4, 4, (10, 6)), (1, 1, 0.25, 2, 1, (1, 1)), (6, 2, 1.0, 2, 8, (12, 4))],
)
def test_children_scored_and_bred_by_hand(mutations, crossovers, share, proposals, scored, bred):
    """8 + 8 at half: 8 scored, 32 bred 16/16; 5 + 3 at half: 4 scored, 16 bred, 16 x 5/8 = 10 mutations; 1 + 1 at
    a quarter: 0.5 rounds to 0, floored at 1; 6 + 2 whole: 8 scored, 16 bred, 12 mutations."""
    settings = SearchConfig(
        mutations=mutations,
        crossovers=crossovers,
        surrogate={"enabled": True, "scored_share": share, "proposals": proposals},
    )
    assert scored_children(settings) == scored and bred_children(settings) == bred
    off = settings.model_copy(update={"surrogate": settings.surrogate.model_copy(update={"enabled": False})})
    assert (scored_children(off), bred_children(off)) == (mutations + crossovers, (mutations, crossovers))


def test_the_gaussian_process_worked_by_hand():
    """Scores 0 and 1 at x = 0 and 1: standardized to -1 and +1, the median distance 2 is the length scale, so
    k = exp(-4 / 8) between them; with a tiny noise the posterior mean passes through both points, reads 0.5 (their
    mean) at the midpoint by symmetry, and reverts to 0.5 far away (k -> 0)."""
    surrogate = GaussianProcessSurrogate.fit(np.array([[0.0], [1.0]]), np.array([0.0, 1.0]), noise=1e-9)
    assert surrogate.length == pytest.approx(2.0)
    predicted = surrogate.predict(np.array([[0.0], [1.0], [0.5], [100.0]]))
    np.testing.assert_allclose(predicted, [0.0, 1.0, 0.5, 0.5], atol=1e-6)


def test_the_gaussian_process_against_a_direct_kernel_solve():
    """The posterior mean against k(x, X) (K + noise I)^-1 (y - mean y) + mean y written out with pairwise
    differences (a second formulation of the distances), on random points of the GA's feature width."""
    rng = np.random.default_rng(3)
    features, scores, fresh = rng.normal(size=(30, 34)), rng.normal(size=30), rng.normal(size=(6, 34))
    surrogate = GaussianProcessSurrogate.fit(features, scores, noise=0.01)
    mean, scale = features.mean(axis=0), features.std(axis=0)
    a, b = (features - mean) / scale, (fresh - mean) / scale
    pairs = ((a[:, None, :] - a[None, :, :]) ** 2).sum(-1)
    length2 = np.median(pairs[~np.eye(30, dtype=bool)])
    kernel = np.exp(-pairs / (2 * length2))
    cross = np.exp(-((b[:, None, :] - a[None, :, :]) ** 2).sum(-1) / (2 * length2))
    expected = cross @ np.linalg.solve(kernel + 0.01 * np.eye(30), scores - scores.mean()) + scores.mean()
    np.testing.assert_allclose(surrogate.predict(fresh), expected, rtol=1e-9, atol=1e-12)


def test_a_gaussian_process_run_resumes_to_the_uninterrupted_run(tmp_path):
    config = job(tmp_path / "clean", "search.surrogate.model=gaussian_process")
    clean_best, _ = run(config, tmp_path / "clean")
    crashed = tmp_path / "crash"
    config = config.model_copy(update={"output_dir": str(crashed)})
    with pytest.raises(RuntimeError, match="simulated coordinator crash"):
        run(config, crashed, FunctionEvaluator(windows=WINDOWS, fail_on_call=4))
    best, _ = run(config, crashed, resume=True)
    assert best == clean_best
    state = json.loads((crashed / "state.json").read_text())["optimizer"]
    assert state == json.loads((tmp_path / "clean" / "state.json").read_text())["optimizer"]
