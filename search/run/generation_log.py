"""The line the coordinator logs after each generation (and each polish step), and the numbers in it.

A generation's line gives its label (search/optimizers/labels.py: "generation 3/20", a descent's "(step 2/5)"), the
evaluations so far (and how many failed, where any did), the best perplexity on the search split (with as many
digits as show a new best), "new best", the early-stop countdown the searcher reports, what the surrogate screened
out (search.surrogate), the forward and backward window passes and the rate. Pure functions of what the coordinator
holds, so the wording is tested without a search.
"""

from __future__ import annotations

import math

from longrope.search.optimizers.searcher import GenerationEnd
from longrope.search.run.run_store import Records, final_count, window_passes


def generation_line(end: GenerationEnd, history: Records, *, racing: bool, seconds: float, scored: int) -> str:
    """One plain line for the generation just ended: evaluations so far, the best perplexity on the search split,
    whether it is new, the early-stop countdown (a "new best" beside it would contradict it, so it shows alone).
    The rate is `scored` (candidates this process scored, over those `seconds`): a resumed run's first generation
    holds results scored before the stop, which its seconds do not cover."""
    stopped = sum(1 for r in history.values() if r.status == "stopped")
    failed = sum(1 for r in history.values() if r.status == "failed")
    new_best = end.best < end.previous_best < math.inf and not end.countdown
    return (
        f"{end.label}  evaluations {final_count(history)}"
        + (f" ({stopped} stopped by racing)" if racing else "")
        + (f" ({failed} failed)" if failed else "")  # on every worker they were tried on: ranked last
        + f"  best search ppl {perplexity_text(end.best, end.previous_best)}"
        + ("  * new best" if new_best else "")
        + end.countdown
        + screening_text(end.screening)
        + "  windows {} fwd + {} bwd".format(*window_passes(history))
        + f"  ({seconds:.1f}s, {scored / max(seconds, 1e-9):.2f} eval/s)"
    )


def screening_text(screening: tuple[int, int] | None) -> str:
    """search.surrogate's counts so far, as the log and `status` say them ('' when it is off or has screened
    nothing yet: generation 0 is never screened)."""
    if screening is None or screening[0] == 0:
        return ""
    proposed, screened_out = screening
    return f"  surrogate screened out {screened_out} of {proposed} children proposed"


def polish_line(end: GenerationEnd, run_best: str, seconds: float) -> str:
    """A polish step's line: which polish and step, the polish's own best (of its points: it starts from the
    evolution's best moved off the grid, so it may stand above the run's) and the run's best."""
    return f"{end.label}  polish best ppl {math.exp(end.best):.4f}  run best ppl {run_best}  ({seconds:.1f}s)"


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
