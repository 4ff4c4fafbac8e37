"""How a generation is named in the log, in `status` and on resume: the numbering every optimizer shares.

Generations are numbered from 0, the initial population (the seeds and their mutations; a descent's seeds), to
`total_generations - 1`. A gradient run names what each of its generations is: 0 the seeds, 1..steps one step
each, the last its best point rounded to the grid (so 5 steps make "generation x/6"). A hybrid's polish runs
between two generations and is named after the one it follows.
"""

from __future__ import annotations


def generation_label(generation: int, total_generations: int, descent_steps: int | None = None) -> str:
    """ "generation g/last", the initial population named as such; `last` grows if a run goes past its plan."""
    last = max(total_generations - 1, generation)
    if descent_steps is not None:
        return f"generation {generation}/{last} ({descent_generation_text(generation, descent_steps)})"
    return f"generation {generation}/{last}" + (" (initial population)" if generation == 0 else "")


def descent_generation_text(generation: int, steps: int) -> str:
    """What a gradient run's generation is (see the module docstring)."""
    if generation == 0:
        return "the seeds"
    if generation <= steps:
        return f"step {generation}/{steps}"
    return "the best point rounded to the grid"


def polish_position(steps_done: int, steps: int, rounded: bool = False) -> str:
    """Where a hybrid's polish stands: "step k/n" (the next one), or its rounding to the grid."""
    if rounded:
        return "rounded to the grid"
    return "its best rounded to the grid" if steps_done >= steps else f"step {steps_done + 1}/{steps}"
