"""A descent's state against history.jsonl: the part of `read_run`'s verdict (run_check.py) for the gradient and
hybrid optimizers, whose state.json holds a descent (u, Adam's moments and step, the held-out best) or a polish
under way.

Nothing in a descent is random, so its state is a function of its recorded points, NLLs and gradients: the
descent is replayed on history.jsonl's lines (`descent_replay.replay`) and its state compared with state.json's,
which finds an Adam moment edited to another finite value of the right length, a polish dropped, or a gradient
edited in a line (the next step's point is not where the recorded gradients lead). It writes nothing.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np

from longrope.search.config.job_config import JobConfig
from longrope.search.optimizers.descent_replay import replay
from longrope.search.optimizers.evolution import told_from_json
from longrope.search.optimizers.genome import GenomeGrid, Seed
from longrope.search.optimizers.gradient import GradientDescent, GradientState
from longrope.search.optimizers.hybrid import HybridState, polish_descent
from longrope.search.optimizers.objective import ObjectiveMix
from longrope.search.run.job_record import JobRecord
from longrope.search.run.run_store import HISTORY, STATE, History, RunDir, RunState, RunStoreError

# ---- a descent's state against history.jsonl ----

REPLAY_TOLERANCE = 1e-9  # relative: the replay runs the same code on the same values, so only a foreign libm differs


def check_descents(
    run_dir: RunDir, config: JobConfig, job: JobRecord | None, state: RunState | None, history: History
) -> None:
    """A gradient run's descent, or a hybrid's polish in progress, is what its lines in history.jsonl give
    (`gradient.replay`), and history.jsonl holds no step it did not ask for. Needs the run's grid, which needs the
    model's lengths: without job.json (lost, or not written yet) the state is only typed-checked (`RunState`)."""
    records = history.records
    if state is None or job is None or not isinstance(state.searcher, GradientState | HybridState):
        return
    grid = GenomeGrid(config.search, pairs=job.pairs, scale=job.target_length / job.original_length)
    mix = ObjectiveMix.of(config.data.objective_weights(), config.data.search_windows)
    if isinstance(state.searcher, GradientState):
        seeds = [
            Seed(r.seed or key, np.asarray(r.factors), r.attention_factor)
            for key, r in records.items()
            if r.generation == 0 and r.status == "scored"
        ]
        descent = GradientDescent(config.search.gradient, grid, seeds, mix)
        _check_replay(run_dir, "optimizer.state", descent, state.searcher, history, list(records))
    else:
        _check_polish(run_dir, config, grid, mix, state.searcher, history)


def _check_polish(
    run_dir: RunDir, config: JobConfig, grid: GenomeGrid, mix: ObjectiveMix, hybrid: HybridState, history: History
) -> None:
    """The hybrid's polishes: the steps of a polish carry the generation the evolution was at (the one after the
    generation polished). A finished polish (after a generation up to polished_through) has all its steps; the
    polish after the last generation done, when that is past polished_through, is replayed from the evolution's
    best; `polish` is there only while one is under way."""
    where, current, records = run_dir.file(STATE), hybrid.generation, history.records
    done, through, steps = current - 1, hybrid.polished_through, config.search.gradient.polish_steps
    field = "optimizer.state"
    if through > max(done, 0):
        raise RunStoreError(f"{where}: {field}.polished_through is {through}, past generation {done}, the last done")
    if hybrid.polish is not None and through >= done:
        raise RunStoreError(
            f"{where}: {field}.polish holds a polish under way, but polished_through {through} says generation "
            f"{done}'s best is polished already"
        )
    counts = Counter(r.generation for r in records.values() if r.gradient_windows is not None)
    for generation, count in sorted(counts.items()):
        if generation == current and through < done:
            continue  # the polish under way (or about to be), replayed below
        if generation - 1 > through:
            raise RunStoreError(
                f"{where}: {field}.polished_through is {through}, but history.jsonl holds polish steps after "
                f"generation {generation - 1}"
                + (f" (a polish under way, and {field}.polish is null)" if generation == current else "")
            )
        if count != steps:
            raise RunStoreError(
                f"{where}: {field}.polished_through is {through}, but history.jsonl holds {count} of the "
                f"{steps} steps of the polish after generation {generation - 1} (a polish not finished?)"
            )
    if through < done:
        genomes, scores = told_from_json(hybrid.evolution.told)
        best = min((key for key in scores if key in genomes), key=lambda key: (scores[key], key))
        polish = polish_descent(config.search, grid, mix, genomes[best])
        steps_now = [key for key, r in records.items() if r.generation == current and r.gradient_windows]
        _check_replay(run_dir, f"{field}.polish", polish, hybrid.polish, history, steps_now)


def _check_replay(
    run_dir: RunDir,
    field: str,
    descent: GradientDescent,
    stored: GradientState | None,
    history: History,
    lines: list[str],
) -> None:
    """Each of `lines` (history keys the descent must account for) is a point the replay asked for (a stray one
    is named first: the line after an edited one is where the replay and the history part), `stored` (None: a
    polish not started, the descent as built) is the replayed descent's state at its generation, and the history
    is at most one generation ahead of it (state.json is written after each)."""
    where = run_dir.file(STATE)
    if stored is not None:
        _check_lengths(where, field, stored, descent.param.size)
    generation = descent.generation if stored is None else stored.generation
    replayed = replay(descent, history.records, generation)
    asked = set(replayed.keys)
    stray = [key for key in lines if key not in asked]
    if stray:
        line = history.line_numbers().get(stray[0], "?")
        raise RunStoreError(
            f"{run_dir.file(HISTORY)}:{line}: a descent point the run's descent never asked for "
            "(the recorded points and gradients before it lead elsewhere: an edited gradient or point, or a line of "
            "another run?)"
        )
    if replayed.state is None:
        raise RunStoreError(
            f"{where}: {field}.generation is {generation}, but history.jsonl's lines take the descent to generation "
            f"{replayed.generation} only (lines lost, edited, or a state.json of another run?)"
        )
    if stored is not None:
        difference = _first_difference(_comparable(replayed.state), _comparable(stored.model_dump()), field)
        if difference:
            path, expected, found = difference
            raise RunStoreError(
                f"{where}: {path} is {_short(found)}, but replaying history.jsonl's points and gradients gives "
                f"{_short(expected)} (a descent's state is a function of its lines: edited, or from another run?)"
            )
    if replayed.generation > generation + 1:
        raise RunStoreError(
            f"{where}: {field}.generation is {generation}, but history.jsonl's lines take the descent to generation "
            f"{replayed.generation} (a state.json from earlier in the run?)"
        )


def _check_lengths(where, field: str, stored: GradientState, size: int) -> None:
    """u and Adam's moments hold one value per parameter: pairs + 1 slack logit (+ 1 for a searched attention)."""
    descent = stored.descent
    for name, values in (("u", descent.u), ("adam.m", descent.adam.m), ("adam.v", descent.adam.v)):
        if values is not None and len(values) != size:
            raise RunStoreError(
                f"{where}: {field}.descent.{name}: {len(values)} values, but the run's descent has {size} parameters"
            )


def _comparable(state: dict[str, Any]) -> dict[str, Any]:
    """A descent's state as compared: `told` as a mapping (its order is the order results arrived in), and
    only the fields a descent writes."""
    fields = ("generation", "descent")
    return {**{name: state.get(name) for name in fields}, "told": {key: score for key, score in state["told"]}}


def _first_difference(expected: Any, found: Any, path: str) -> tuple[str, Any, Any] | None:
    """The first place (a dotted path, list items as [i]) where `found` differs from `expected`; numbers within
    REPLAY_TOLERANCE are equal."""
    if isinstance(expected, dict) and isinstance(found, dict):
        if set(expected) != set(found):
            return path, sorted(expected), sorted(found)
        return next((d for k in expected if (d := _first_difference(expected[k], found[k], f"{path}.{k}"))), None)
    if isinstance(expected, list | tuple) and isinstance(found, list | tuple):
        if len(expected) != len(found):
            return f"{path} ({len(found)} values)", f"{len(expected)} values", f"{len(found)} values"
        return next(
            (
                d
                for i, (e, f) in enumerate(zip(expected, found, strict=True))
                if (d := _first_difference(e, f, f"{path}[{i}]"))
            ),
            None,
        )
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (expected, found))
    if numbers and math.isclose(expected, found, rel_tol=REPLAY_TOLERANCE, abs_tol=1e-12):
        return None
    return None if expected == found and type(expected) is type(found) else (path, expected, found)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
