"""The corruption suite's cases for a descent: state.json's polish times and history.jsonl's descent lines,
edited as a user or a copy between runs would; each with a substring of the one error line every reader must give
(tests/test_run_dir_checks.py runs them with the other corruptions). state.json holds no descent (a resume replays
it from history.jsonl), so no case edits one."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
from run_dir_helpers import GRADIENT, descent_run, edit_json, mid_polish, rewrite_line, set_field, step_lines

ADAM_POLISH = "search.gradient.polish_method=adam"


def polish_seconds_negative(t: Path) -> Path:
    """A polish step's time, which status's ETA reads and a resume carries on, edited below 0."""
    run = mid_polish(t / "run")
    edit_json(run / "state.json", lambda s: set_field(s, ["polish_seconds"], [-5.0] * len(s["polish_seconds"])))
    return run


def step_line_changed(change: Callable[[dict], dict]) -> Callable[[Path], Path]:
    """A killed gradient run (steps 1-2 told) whose first step's line is changed."""

    def corrupt(t: Path) -> Path:
        run = descent_run(t / "run", GRADIENT, fail_on_call=4)
        rewrite_line(run / "history.jsonl", step_lines(run)[0], change)
        return run

    return corrupt


def _scaled_gradient(record: dict) -> dict:
    return {**record, "gradient": [2 * g for g in record["gradient"]]}


DESCENT_CORRUPTIONS = [
    pytest.param(
        polish_seconds_negative,
        "state.json: corrupted (polish_seconds.0: Input should be greater than or equal to 0",
        id="polish-seconds-negative",
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
]

# Found only by a resume, which replays history.jsonl through the searcher: the search asks for a point other than
# the one recorded after the edited line. state.json keeps no copy of a descent's state for status or export to
# compare a line with (the history is the record); the coordinator refuses it before scoring anything.
RESUME_CORRUPTIONS = [
    pytest.param(
        step_line_changed(_scaled_gradient),
        "is one the search never asked for (the results recorded before it lead elsewhere",
        id="gradient-edited",
    ),
]
