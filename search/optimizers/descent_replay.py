"""A descent replayed on its history.jsonl lines: the check that state.json's descent is the one its lines give."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from longrope.search.optimizers.gradient import RECORDED_DECIMALS, GradientDescent
from longrope.search.optimizers.history_record import HistoryRecord
from longrope.search.optimizers.searcher import Candidate


@dataclass(frozen=True)
class Replay:
    """What a descent's history.jsonl lines give (`replay`): its state when it stood at a generation (None: the
    lines run out before it), how far the lines take it, and the keys of the lines it asked for, in order."""

    state: dict[str, Any] | None
    generation: int
    keys: tuple[str, ...]


def replay(descent: GradientDescent, records: Mapping[str, HistoryRecord], generation: int) -> Replay:
    """Tell `descent` the recorded result of each point it asks for, from where it stands, while history.jsonl holds
    that point as it would be scored (same factors, attention factor and gradient windows), and keep its state at
    `generation`.

    Nothing in a descent is random: its state (u, Adam's moments and step, the held-out best and patience, the
    rounding) is a function of its recorded points, NLLs and gradients alone. So this, not a look at the numbers,
    is how a state.json is checked: an Adam moment edited to another finite value of the right length is found only
    by recomputing it, and a gradient edited in a line is found because the next step's point, or the state, is not
    where the recorded gradients lead. The replay runs the descent's own code on the values written, so on the
    machine that wrote them it gives back the same bits (what exact resume already relies on)."""
    state, keys = None, []
    while True:
        if descent.generation == generation:
            state = copy.deepcopy(descent.state().model_dump(mode="json"))  # the descent's dicts go on changing
        if descent.done():
            break
        points = descent.ask()
        found = [records.get(point.key) for point in points]
        if not points or not all(map(_recorded_as_asked, points, found)):
            break
        descent.tell(found)
        keys += [point.key for point in points]
    descent.pending = {}
    return Replay(state, descent.generation, tuple(keys))


def _recorded_as_asked(point: Candidate, record: HistoryRecord | None) -> bool:
    """A final history record of the point as the descent asks it: its factors (as recorded, 6 decimals), its
    attention factor when the descent sets one (otherwise the encoding's own is recorded) and, for a step, its
    gradient windows."""
    if record is None or record.status != "scored":
        return False
    factors = [round(float(f), RECORDED_DECIMALS) for f in point.factors]
    windows = None if point.gradient_windows is None else list(point.gradient_windows)
    return (
        record.factors == factors
        and (point.attention_factor is None or record.attention_factor == point.attention_factor)
        and record.gradient_windows == windows
    )
