"""How much search one lease allows: the forward and gradient times measured at each target length, then the GA's and
the descent's budgets sized to what is left once the table's own forwards are counted.

Nothing here is guessed from a GPU's specification: a window's forward and gradient pass are timed on the GPU run's
own model and windows first (`Timing`), and every budget is arithmetic on those times (`make_plan`), so the same code
sizes a search for an H200 at 64k and for the CPU dry run at 256 tokens. The table's forwards come first (the
tuning grid on the search windows, every baseline, tuned and searched row on the test windows, at each target); what
is left goes two thirds to the GA (the mission's method, screened by the surrogate) and a third to descent. The GA
runs as the hybrid optimizer: the GA, then `POLISH_STEPS` line-search steps from its best, so one run gives two rows
without paying for the GA twice, the GA's best before the polish and the hybrid's after it (the optimizer arms' way; the
evolution inside the hybrid is the GA's own, untouched). The GA's shape scales search/config's defaults down
(population 64, 32 parents, 16 + 16 children) to 16, 8 and 8 + 8, or smaller when even one generation of that and
the polish would not fit, and takes as many generations as fit; descent takes as many steps as fit. Both targets run
the same shape, so their tables compare. A table with one search (Gemma 3's: descent, profiles.py) gives it all that is
left. The window counts may differ by target (Gemma 3's 8 test windows at 64k, 4 at 128k): every cost is summed per
target with that target's counts.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from gpu_table_parts.profiles import DESCENT, HYBRID
from longrope.search.config.search_section import DEFAULT_SEEDS
from longrope.search.reports.compare_result import BASELINES

SEEDS = DEFAULT_SEEDS  # PI, NTK, YaRN and the tuned grids' settings: does the GA still end behind tuned NTK?
HOLDOUT_WINDOWS = 1  # descent's windows held out for its stopping rule
GA_ROW = "searched: GA + surrogate"
HYBRID_ROW = "searched: hybrid"  # the same GA run, then polished
DESCENT_ROW = "searched: descent"
SEARCHED_ROWS = {HYBRID: (GA_ROW, HYBRID_ROW), DESCENT: (DESCENT_ROW,)}
TABLE_ROWS = len(BASELINES) + len((GA_ROW, HYBRID_ROW, DESCENT_ROW))  # compare's baselines and the searched rows
POLISH_STEPS = 6  # the hybrid's polish after the GA, as configs/smollm2-135m-16k-hybrid.yaml
GA_SHARE = 2 / 3
GA_SHAPES = ((16, 8, 8), (8, 4, 4), (4, 2, 2))  # (population, parents, mutations = crossovers)


class Timing(BaseModel):
    """Seconds of one window at `length`: a forward of one candidate, and a gradient pass (Scorer.score_with_gradient,
    forward + backward with the layers checkpointed), each after a warm-up."""

    model_config = ConfigDict(extra="forbid")

    length: int
    forward_seconds: float
    gradient_seconds: float


class SearchBudget(BaseModel):
    """One optimizer's settings (search section fields, as `--set` would give them), what they score at most
    (search/optimizers' `plan`) and the seconds that costs at both targets."""

    model_config = ConfigDict(extra="forbid")

    optimizer: str
    search: dict
    candidates: int
    backward_steps: int
    seconds: float


class Plan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    budget_seconds: float  # what was left of the deadline when planned
    table_seconds: float  # the tuning and every row, both targets
    ga: SearchBudget | None
    descent: SearchBudget | None
    note: str


Windows = int | dict[int, int]  # one count for every target, or one per target length


def count(windows: Windows, length: int) -> int:
    return windows if isinstance(windows, int) else windows[length]


def table_rows(optimizers: tuple[str, ...]) -> int:
    """compare's baselines and the rows the searches give."""
    return len(BASELINES) + sum(len(SEARCHED_ROWS[name]) for name in optimizers)


def search_seconds(candidates: int, backward: int, timings: list[Timing], search_windows: Windows) -> float:
    """A search's time at every target: each candidate a forward on every search window, except a descent step's
    gradient windows, which take a gradient pass instead."""
    total = 0.0
    for t in timings:
        windows = count(search_windows, t.length)
        step = (windows - HOLDOUT_WINDOWS) * t.gradient_seconds + HOLDOUT_WINDOWS * t.forward_seconds
        total += (candidates - backward) * windows * t.forward_seconds + backward * step
    return total


def table_seconds(
    timings: list[Timing],
    tuning_settings: dict[int, int],
    search_windows: Windows,
    test_windows: Windows,
    rows: int = TABLE_ROWS,
):
    return sum(
        t.forward_seconds
        * (tuning_settings[t.length] * count(search_windows, t.length) + rows * count(test_windows, t.length))
        for t in timings
    )


def ga_budget(
    seconds: float, timings: list[Timing], search_windows: Windows, max_generations: int
) -> SearchBudget | None:
    """The largest GA shape with at least one generation after generation 0 and the polish after it, and as many
    generations as fit."""
    from longrope.search.config.search_section import SearchConfig
    from longrope.search.optimizers.factory import search_plan

    for population, parents, children in GA_SHAPES:
        best = None
        for generations in range(1, max_generations + 1):
            search = {
                "optimizer": "hybrid",
                "seeds": list(SEEDS),
                "population": population,
                "parents": parents,
                "mutations": children,
                "crossovers": children,
                "generations": generations,
                "surrogate": {"enabled": True},
                "gradient": {"polish_steps": POLISH_STEPS, "holdout_windows": HOLDOUT_WINDOWS},
            }
            settings = SearchConfig.model_validate(search)
            plan = search_plan(settings, settings.most_seeds())
            cost = search_seconds(plan.candidates, plan.backward_steps, timings, search_windows)
            if cost > seconds:
                break
            best = SearchBudget(
                optimizer="hybrid",
                search=search,
                candidates=plan.candidates,
                backward_steps=plan.backward_steps,
                seconds=cost,
            )
        if best is not None:
            return best
    return None


def descent_budget(
    seconds: float, timings: list[Timing], search_windows: Windows, max_steps: int, settings: dict | None = None
) -> SearchBudget | None:
    """Gradient descent from the best seed with as many steps as fit (at most `max_steps`, the default 60);
    `settings`: the gradient section's other fields (a profile's step size and patience)."""
    from longrope.search.config.search_section import SearchConfig
    from longrope.search.optimizers.factory import search_plan

    best = None
    for steps in range(1, max_steps + 1):
        search = {
            "optimizer": "gradient",
            "seeds": list(SEEDS),
            "gradient": {**(settings or {}), "steps": steps, "holdout_windows": HOLDOUT_WINDOWS},
        }
        validated = SearchConfig.model_validate(search)
        plan = search_plan(validated, validated.most_seeds())
        cost = search_seconds(plan.candidates, plan.backward_steps, timings, search_windows)
        if cost > seconds:
            break
        best = SearchBudget(
            optimizer="gradient",
            search=search,
            candidates=plan.candidates,
            backward_steps=plan.backward_steps,
            seconds=cost,
        )
    return best


def make_plan(
    timings: list[Timing],
    budget_seconds: float,
    *,
    tuning_settings: dict[int, int],
    search_windows: Windows,
    test_windows: Windows,
    max_generations: int = 40,
    max_steps: int = 60,
    optimizers: tuple[str, ...] = (HYBRID, DESCENT),
    descent: dict | None = None,
) -> Plan:
    """The table first; the rest two thirds GA, a third descent, or all of it to the one search of `optimizers` (None
    where not one generation or step fits, or where the table runs no such search)."""
    table = table_seconds(timings, tuning_settings, search_windows, test_windows, table_rows(optimizers))
    left = budget_seconds - table
    if left <= 0:
        note = f"the table alone needs {table:.0f} s of the {budget_seconds:.0f} s left: no search"
        return Plan(budget_seconds=budget_seconds, table_seconds=table, ga=None, descent=None, note=note)
    share = GA_SHARE if DESCENT in optimizers else 1.0
    ga = ga_budget(left * share, timings, search_windows, max_generations) if HYBRID in optimizers else None
    descent_left = left - (ga.seconds if ga else 0.0)
    descent_plan = (
        descent_budget(descent_left, timings, search_windows, max_steps, descent) if DESCENT in optimizers else None
    )
    parts = [f"table {table:.0f} s"]
    polish = f" (the last {POLISH_STEPS + 1} its polish)"
    if HYBRID in optimizers:
        parts.append(f"GA {ga.candidates} candidates{polish}, {ga.seconds:.0f} s" if ga else "no GA generation fits")
    if DESCENT in optimizers:
        found = descent_plan
        steps = f"descent {found.backward_steps} steps, {found.seconds:.0f} s" if found else "no descent step fits"
        parts.append(steps)
    note = f"of {budget_seconds:.0f} s: " + "; ".join(parts)
    return Plan(budget_seconds=budget_seconds, table_seconds=table, ga=ga, descent=descent_plan, note=note)
