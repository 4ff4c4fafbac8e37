"""The hybrid's polish by backtracking line search: each step is kept only where it lowers the search NLL, so a
polish never ends worse than the evolution's best it started from. Worked by hand on a quadratic, then on the known
problem against the Adam polish (`search.gradient.polish_method=adam`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from known_problem import TARGET, problem
from search_helpers import FunctionEvaluator, make_coordinator, replayed_state, write_job_record

from longrope.search.config.search_section import GradientConfig
from longrope.search.optimizers.factory import load_job_config
from longrope.search.optimizers.line_search import BacktrackingLineSearch, LineSearchState
from longrope.search.run.run_store import RunDir

WINDOWS = 4


def test_the_steps_on_a_quadratic_worked_by_hand():
    """f(u) = |u|^2, g = 2u, from (3, 4) (f 25, |g| 10) at alpha 1: (2.4, 3.2) f 16 kept, alpha 2; (1.2, 1.6) f 4
    kept, alpha 4; (-1.2, -1.6) f 4 refused (not below 4 - 1e-4 x 4 x 4), alpha 2 from (1.2, 1.6): (0, 0)."""
    search = BacktrackingLineSearch(alpha=1.0)
    u = np.array([3.0, 4.0])
    trials = []
    for _ in range(4):
        u = search.next_point(u, float(u @ u), 2 * u)
        trials.append(u.copy())
    np.testing.assert_allclose(trials, [[2.4, 3.2], [1.2, 1.6], [-1.2, -1.6], [0.0, 0.0]], atol=1e-12)
    assert (search.accepted, search.refused, search.alpha) == (2, 1, 2.0)
    np.testing.assert_allclose(search.anchor, [1.2, 1.6])


def test_a_non_finite_point_is_refused_and_the_state_round_trips():
    search = BacktrackingLineSearch(alpha=0.5)
    start = np.array([1.0, 0.0])
    first = search.next_point(start, 1.0, np.array([2.0, 0.0]))
    again = search.next_point(first, float("nan"), np.array([0.0, 0.0]))
    np.testing.assert_allclose(again, [1.0 - 0.25, 0.0])  # refused: half the step, from the same anchor
    copy = BacktrackingLineSearch(alpha=0.5)
    copy.load_state(LineSearchState.model_validate(json.loads(search.state().model_dump_json())))
    assert copy.state() == search.state()
    np.testing.assert_array_equal(
        copy.next_point(again, 0.5, np.array([1.0, 0.0])), search.next_point(again, 0.5, np.array([1.0, 0.0]))
    )


def hybrid_run(run_dir, evaluator, *extra: str):
    """A hybrid on the known problem (4 generations), polished once at its end in 6 steps; returns its config."""
    settings = [
        "target_length=256",
        f"data.search_windows={WINDOWS}",
        "search.seed=5",
        "search.optimizer=hybrid",
        "search.generations=4",
        "search.gradient.polish_steps=6",
        f"output_dir={run_dir}",
        *extra,
    ]
    config = load_job_config(None, settings)
    RunDir(run_dir).create(config)
    write_job_record(run_dir, config, search_windows={"count": WINDOWS, "tokens": TARGET + 1})
    try:
        make_coordinator(config, RunDir(run_dir), evaluator, problem(WINDOWS)).run()
    except RuntimeError as crash:
        crash.config = config  # a simulated crash: the test reads the run it left
        raise
    return config


def polish_lines(run_dir, method: str, wobble: float, steps: int = 6, probes: int = 1) -> list[dict]:
    """The polish's lines (those with a gradient) of a finished hybrid run, in the order scored."""
    polish = [f"search.gradient.polish_method={method}", f"search.gradient.polish_steps={steps}"]
    evaluator = FunctionEvaluator(windows=WINDOWS, wobble=wobble)
    hybrid_run(run_dir, evaluator, *polish, f"search.gradient.polish_probes={probes}")
    records = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    return [r for r in records if "gradient" in r]


def test_on_a_smooth_objective_the_polish_gains_on_its_start(tmp_path):
    """The first polish step scores the start (the evolution's best, off the grid by the parametrization's half
    step); on the smooth known problem the steps the line search keeps go below it."""
    scores = [r["mean_nll"] for r in polish_lines(tmp_path, "line_search", wobble=0.0)]
    assert len(scores) == 6 and min(scores[1:]) < scores[0]


@pytest.mark.parametrize("fail_on_call", [8, 10, 11])
def test_mid_polish_the_anchor_is_the_best_step_told_and_alpha_follows_the_verdicts(tmp_path, fail_on_call):
    """Killed in the polish (calls 1-5 are generations 0-4, 6-11 the polish's 6 steps): state.json's line search,
    against what the told steps' history.jsonl lines give by a second reckoning: the anchor's score is the lowest step
    score told (the wobble keeps steps apart by far more than Armijo's margin), every step after the first was
    accepted or refused, and alpha is the first step size doubled per acceptance (at most 8x) and halved per
    refusal, in the order told."""
    run_dir = tmp_path / "run"
    evaluator = FunctionEvaluator(windows=WINDOWS, wobble=0.05, fail_on_call=fail_on_call)
    with pytest.raises(RuntimeError, match="simulated coordinator crash") as crash:
        hybrid_run(run_dir, evaluator)
    lines = (run_dir / "history.jsonl").read_text().splitlines()
    records = {record["key"]: record for record in map(json.loads, lines)}
    polish = replayed_state(crash.value.config, RunDir(run_dir), WINDOWS)["polish"]  # as a resume rebuilds it
    scores = [records[key]["mean_nll"] for key, _ in polish["told"]]  # the steps the polish was told, in order
    line_search = polish["descent"]["line_search"]
    first_alpha = GradientConfig().polish_learning_rate
    alpha, best, accepted = first_alpha, scores[0], 0
    for score in scores[1:]:
        if score < best:
            best, accepted, alpha = score, accepted + 1, min(2 * alpha, 8 * first_alpha)
        else:
            alpha /= 2
    assert len(scores) == fail_on_call - 6 and all("gradient" in records[key] for key, _ in polish["told"])
    assert line_search["anchor_score"] == best == min(scores)
    assert (line_search["accepted"], line_search["refused"]) == (accepted, len(scores) - 1 - accepted)
    assert line_search["alpha"] == pytest.approx(alpha, rel=1e-12)


def test_trials_are_what_next_point_gives_after_each_refusal():
    """From the anchor (1, 0) with gradient (2, 0) at alpha 0.5: trials (0.5, 0), (0.75, 0), (0.875, 0), the points
    three refusals in a row give one at a time, bit for bit."""
    search = BacktrackingLineSearch(alpha=0.5)
    first = search.next_point(np.array([1.0, 0.0]), 1.0, np.array([2.0, 0.0]))
    trials = search.trials(3)
    np.testing.assert_allclose(trials, [[0.5, 0.0], [0.75, 0.0], [0.875, 0.0]], atol=1e-15)
    one_at_a_time = [first]
    for _ in range(2):
        one_at_a_time.append(search.next_point(one_at_a_time[-1], 2.0, np.array([1.0, 0.0])))  # worse: refused
    assert all(np.array_equal(a, b) for a, b in zip(trials, one_at_a_time, strict=True))


def polish_states(run_dir, steps: int, probes: int) -> list[dict]:
    """The hybrid's polish line search after each polish generation is told (watched, not changed)."""
    settings = ["target_length=256", f"data.search_windows={WINDOWS}", "search.seed=5", "search.optimizer=hybrid"]
    polish = [f"search.gradient.polish_steps={steps}", f"search.gradient.polish_probes={probes}"]
    config = load_job_config(None, [*settings, "search.generations=4", *polish, f"output_dir={run_dir}"])
    RunDir(run_dir).create(config)
    evaluator = FunctionEvaluator(windows=WINDOWS, wobble=0.05)
    coordinator = make_coordinator(config, RunDir(run_dir), evaluator, problem(WINDOWS))
    searcher, states = coordinator.searcher, []
    tell = searcher.tell

    def watched_tell(results):
        ends = tell(results)
        polish_search = searcher.polish.line_search if searcher.polish is not None else None
        if ends and ends[0].polish and polish_search is not None:
            states.append(polish_search.state().model_dump())
        return ends

    searcher.tell = watched_tell
    coordinator.run()
    return states


def test_probes_move_the_line_search_as_one_trial_at_a_time_does_in_fewer_generations(tmp_path):
    """polish_probes 3: each polish generation scores 3 trials from the anchor at once and keeps the first the Armijo
    test takes. A second formulation, the polish told one trial a step: every state the 3-trial polish passes
    through (anchor, its score and gradient, alpha, the counts) is one the 1-trial polish passes through, in the
    same order, and in 6 generations it judges more trials than the 1-trial polish does in 6 steps."""
    one = polish_states(tmp_path / "one", steps=24, probes=1)
    three = polish_states(tmp_path / "three", steps=6, probes=3)
    assert len(three) == 6 and three[0] == one[0]  # the first step scores the start alone: the anchor
    places = [one.index(state) for state in three]  # raises if a state is not one of the 1-trial polish's
    assert places == sorted(places) and len(set(places)) == len(places)
    judged = three[-1]["accepted"] + three[-1]["refused"]  # trials judged after the start: one[i] has judged i
    assert judged == places[-1] > 5


def test_probes_need_the_line_search():
    with pytest.raises(ValueError, match="polish_probes: 3 trial steps at once need polish_method 'line_search'"):
        GradientConfig(polish_probes=3, polish_method="adam")
