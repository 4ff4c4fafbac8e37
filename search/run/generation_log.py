"""The line the coordinator logs after each generation, and the numbers in it.

Generations are numbered from 0, the initial population (seeds and their mutations), to `total_generations - 1`.
A generation's line gives the evaluations so far, the best perplexity on the search split (with as many digits as
show a new best), the early-stop countdown, the forward and backward window passes and the rate. Pure functions
of what the coordinator holds, so the wording is tested without a search.
"""

from __future__ import annotations

import math
from typing import Any

from longrope.search.config.search_section import EarlyStopConfig, GradientConfig
from longrope.search.run.run_store import final_count, window_passes


def generation_label(generation: int, total_generations: int, descent_steps: int | None = None) -> str:
    """ "generation g/last", the initial population named as such; `last` grows if a run goes past its plan.
    A gradient run (`descent_steps` given) says what its generation is: 0 the seeds, 1..steps one step each, and
    the last, steps + 1, its best point rounded to the grid (so 5 steps make "generation x/6")."""
    last = max(total_generations - 1, generation)
    if descent_steps is not None:
        return f"generation {generation}/{last} ({descent_generation_text(generation, descent_steps)})"
    return f"generation {generation}/{last}" + (" (initial population)" if generation == 0 else "")


def descent_generation_text(generation: int, steps: int) -> str:
    """What a gradient run's generation is (see `generation_label`)."""
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


def resume_position(optimizer: Any, polish_pending: bool) -> str:
    """Where a run goes on from: its next generation, or (a hybrid) the polish between two generations, as "the
    polish after generation g/last, step k/n": the polish's steps carry the generation after g, which printed as
    "generation g+1/last" reads as past the run's end."""
    total = optimizer.total_generations
    if polish_pending:
        done, polish = optimizer.generation - 1, optimizer.polish
        steps_done = 0 if polish is None else polish.generation - 1
        steps = optimizer.settings.gradient.polish_steps
        return f"the polish after generation {done}/{total - 1}, {polish_position(steps_done, steps)}"
    descent_steps = optimizer.steps if getattr(optimizer, "kind", None) == "gradient" else None
    return generation_label(optimizer.generation, total, descent_steps)


def generation_line(
    generation: int,
    total_generations: int,
    best_by_generation: list[float],
    history: dict[str, dict[str, Any]],
    *,
    racing: bool,
    countdown: str,
    seconds: float,
    descent_steps: int | None = None,
) -> str:
    """One plain line for `generation`, just ended: evaluations so far, the best perplexity on the search split,
    whether it is new, the early-stop `countdown` (a "new best" beside it would contradict it, so it shows alone)."""
    best_nll = best_by_generation[-1]
    previous = best_by_generation[-2] if len(best_by_generation) > 1 else math.inf
    stopped = sum(1 for r in history.values() if r.get("status") == "stopped")
    fresh = sum(1 for record in history.values() if record["generation"] == generation)
    return (
        f"{generation_label(generation, total_generations, descent_steps)}  evaluations {final_count(history)}"
        + (f" ({stopped} stopped by racing)" if racing else "")
        + f"  best search ppl {perplexity_text(best_nll, previous)}"
        + ("  * new best" if best_nll < previous < math.inf and not countdown else "")
        + countdown
        + "  windows {} fwd + {} bwd".format(*window_passes(history))
        + f"  ({seconds:.1f}s, {fresh / max(seconds, 1e-9):.2f} eval/s)"
    )


def countdown_text(best_by_generation: list[float], early_stop: EarlyStopConfig, stopped_early: bool) -> str:
    """How close early stopping is: "no gain >= 0.001 for k/P generations", k being how many generations back
    the best has gained less than `min_improvement` (the rule the coordinator stops on at k = P). A new best
    smaller than that gain does not reset it, hence "gain", not "new best"; such a generation's line shows the
    countdown alone (its perplexity printed with the digits that show the small gain), since "new best" beside
    "no gain" reads as a contradiction."""
    patience, stale = early_stop.patience, generations_without_gain(best_by_generation, early_stop)
    if not patience or (not stale and not stopped_early):
        return ""
    minimum = early_stop.min_improvement
    what = f"no gain >= {minimum:g}" if minimum > 0 else "no improvement"
    stop = ": early stop" if stopped_early else ""
    return f"  {what} for {min(stale, patience)}/{patience} generations{stop}"


def held_out_countdown_text(descent: Any, settings: GradientConfig) -> str:
    """Descent's own early stop: steps since the held-out windows' NLL last gained `min_improvement`."""
    if not settings.patience or not descent.since_gain:
        return ""
    stop = ": early stop" if descent.stopped_early else ""
    gain = f"no gain >= {settings.min_improvement:g}"
    return f"  held-out: {gain} for {descent.since_gain}/{settings.patience} steps{stop}"


def generations_without_gain(best: list[float], early_stop: EarlyStopConfig) -> int:
    """How many generations back the best has gained less than `min_improvement` (at most `patience`)."""
    stale = 0
    for back in range(1, min(len(best) - 1, early_stop.patience or 0) + 1):
        if best[-1 - back] - best[-1] >= early_stop.min_improvement:
            break
        stale = back
    return stale


def perplexity_text(nll: float, previous_nll: float, digits: int = 4) -> str:
    """exp(nll) with `digits` decimals, or as many more (up to 12) as it takes to differ from exp(previous_nll)
    printed alike: a new best must not print the same number as the best it replaced."""
    if not math.isfinite(nll):
        return "-"
    for places in range(digits, 13):
        text = f"{math.exp(nll):.{places}f}"
        if not math.isfinite(previous_nll) or nll >= previous_nll or text != f"{math.exp(previous_nll):.{places}f}":
            return text
    return text
