"""The corruption suite's cases for a descent's state (issue 27, items 3-8): state.json's descent and polish, and
history.jsonl's descent lines, edited as a user or a copy between runs would; each with a substring of the one
error line every reader must give (tests/test_run_dir_checks.py runs them with the other corruptions)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from run_dir_helpers import GRADIENT, descent_run, edit_json, mid_polish, rewrite_line, set_field, step_lines

ADAM_POLISH = "search.gradient.polish_method=adam"


def polish_adam_moment_one_value(t: Path) -> Path:
    run = mid_polish(t / "run", ADAM_POLISH)
    edit_json(
        run / "state.json", lambda s: set_field(s, ["optimizer", "state", "polish", "descent", "adam", "m"], [0.0])
    )
    return run


def polish_adam_moment_edited(t: Path) -> Path:
    """The right length, finite: found only by replaying the polish on history.jsonl's gradients."""
    run = mid_polish(t / "run", ADAM_POLISH)
    m = json.loads((run / "state.json").read_text())["optimizer"]["state"]["polish"]["descent"]["adam"]["m"]
    edit_json(
        run / "state.json",
        lambda s: set_field(s, ["optimizer", "state", "polish", "descent", "adam", "m"], [0.0] * len(m)),
    )
    return run


def polish_line_search_alpha_edited(t: Path) -> Path:
    """The line search's next step size, positive and finite, doubled: found only by replaying the polish."""
    run = mid_polish(t / "run")
    path = ["optimizer", "state", "polish", "descent", "line_search", "alpha"]
    alpha = json.loads((run / "state.json").read_text())["optimizer"]["state"]["polish"]["descent"]["line_search"]
    edit_json(run / "state.json", lambda s: set_field(s, path, 2 * alpha["alpha"]))
    return run


def polish_line_search_half_an_anchor(t: Path) -> Path:
    run = mid_polish(t / "run")
    edit_json(
        run / "state.json",
        lambda s: set_field(s, ["optimizer", "state", "polish", "descent", "line_search", "anchor_score"], None),
    )
    return run


def polish_seconds_negative(t: Path) -> Path:
    """A polish step's time, which status's ETA reads and a resume carries on, edited below 0."""
    run = mid_polish(t / "run")
    edit_json(run / "state.json", lambda s: set_field(s, ["polish_seconds"], [-5.0] * len(s["polish_seconds"])))
    return run


def polish_dropped(t: Path) -> Path:
    """polish null and polished_through 2: as if the polish after generation 2 were done, with 1 of its 4 steps."""
    run = mid_polish(t / "run")
    edit_json(run / "state.json", lambda s: set_field(s, ["optimizer", "state", "polish"], None))
    edit_json(run / "state.json", lambda s: set_field(s, ["optimizer", "state", "polished_through"], 2))
    return run


def descent_adam_moment_two_values(t: Path) -> Path:
    run = descent_run(t / "run", GRADIENT, fail_on_call=4)
    edit_json(run / "state.json", lambda s: set_field(s, ["optimizer", "state", "descent", "adam", "m"], [0.0, 0.0]))
    return run


def descent_u_nan(t: Path) -> Path:
    run = descent_run(t / "run", GRADIENT, fail_on_call=4)
    state = (run / "state.json").read_text()
    start = state.index('"u": [') + len('"u": [')
    (run / "state.json").write_text(state[:start] + "NaN" + state[state.index(",", start) :])
    return run


def step_line_changed(change: Callable[[dict], dict]) -> Callable[[Path], Path]:
    """A killed gradient run (steps 1-2 told) whose first step's line is changed."""

    def corrupt(t: Path) -> Path:
        run = descent_run(t / "run", GRADIENT, fail_on_call=4)
        rewrite_line(run / "history.jsonl", step_lines(run)[0], change)
        return run

    return corrupt


def last_step_gradient_edited(t: Path) -> Path:
    """The last step of a finished run: no later point shows it, the state's u and moments do."""
    run = descent_run(t / "run", GRADIENT)
    rewrite_line(run / "history.jsonl", step_lines(run)[-1], lambda r: {**r, "gradient": [0.0] * len(r["gradient"])})
    return run


def _scaled_gradient(record: dict) -> dict:
    return {**record, "gradient": [2 * g for g in record["gradient"]]}


DESCENT_CORRUPTIONS = [
    pytest.param(
        polish_adam_moment_one_value,
        "state.json: optimizer.state.polish.descent.adam.m: 1 values, but the run's descent has 17 parameters",
        id="polish-adam-m-one-value",
    ),
    pytest.param(
        polish_adam_moment_edited,
        "state.json: optimizer.state.polish.descent.adam.m[0] is 0.0, but replaying history.jsonl's points and "
        "gradients",
        id="polish-adam-m-edited",
    ),
    pytest.param(
        polish_line_search_alpha_edited,
        "state.json: optimizer.state.polish.descent.line_search.alpha is",
        id="polish-line-search-alpha-edited",
    ),
    pytest.param(
        polish_line_search_half_an_anchor,
        "anchor: its u, anchor_score and anchor_gradient are given together or not at all",
        id="polish-line-search-half-an-anchor",
    ),
    pytest.param(
        polish_seconds_negative,
        "state.json: corrupted (polish_seconds.0: Input should be greater than or equal to 0",
        id="polish-seconds-negative",
    ),
    pytest.param(
        polish_dropped,
        "state.json: optimizer.state.polished_through is 2, but history.jsonl holds 1 of the 4 steps of the polish "
        "after generation 2",
        id="polish-dropped",
    ),
    pytest.param(
        descent_adam_moment_two_values,
        "state.json: optimizer.state.descent.adam.m: 2 values, but the run's descent has 17 parameters",
        id="descent-adam-m-two-values",
    ),
    pytest.param(
        descent_u_nan,
        "state.json: corrupted (optimizer.state.descent.u.0: Input should be a finite number",
        id="u-nan",
    ),
    pytest.param(
        step_line_changed(lambda r: {**r, "backward_windows": "abc"}),
        "corrupted line (backward_windows: Input should be a valid integer",
        id="backward-windows-abc",
    ),
    pytest.param(
        step_line_changed(lambda r: {**r, "backward_windows": None}),
        "corrupted line (backward_windows: Input should be a valid integer",
        id="backward-windows-null",
    ),
    pytest.param(
        step_line_changed(lambda r: {**r, "backward_windows": -600}),
        "corrupted line (backward_windows: Input should be greater than or equal to 0",
        id="backward-windows-negative",
    ),
    pytest.param(
        step_line_changed(lambda r: {**r, "backward_windows": 100000}),
        "backward_windows: must be the 2 gradient windows, got 100000",
        id="backward-windows-100000",
    ),
    pytest.param(
        step_line_changed(lambda r: {**r, "backward_windows": 6.9}),
        "corrupted line (backward_windows: Input should be a valid integer",
        id="backward-windows-6.9",
    ),
    pytest.param(
        step_line_changed(lambda r: {**r, "gradient": [math.nan, *r["gradient"][1:]]}),
        "corrupted line (gradient.0: Input should be a finite number",
        id="gradient-nan",
    ),
    pytest.param(
        step_line_changed(lambda r: {**r, "gradient_windows": [0, 99]}),
        "gradient_windows: must be [first, last) within the line's 4 windows, got [0, 99]",
        id="gradient-windows-0-99",
    ),
    pytest.param(
        step_line_changed(lambda r: {**r, "gradient_windows": [2, 4]}),
        "gradient_windows [2, 4], but step 1 reads [0, 2]; the line does not belong to this run",
        id="gradient-windows-held-out",
    ),
    pytest.param(
        step_line_changed(_scaled_gradient),
        "history.jsonl:5: a descent point the run's descent never asked for",
        id="gradient-edited",
    ),
    pytest.param(
        last_step_gradient_edited,
        "state.json: optimizer.state.descent.u[0] is",
        id="last-gradient-edited",
    ),
]
