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
the same shape, so their tables compare.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from longrope.search.reports.compare_result import BASELINES

SEEDS = ("pi", "ntk", "yarn")
HOLDOUT_WINDOWS = 1  # descent's windows held out for its stopping rule
GA_ROW = "searched: GA + surrogate"
HYBRID_ROW = "searched: hybrid"  # the same GA run, then polished
DESCENT_ROW = "searched: descent"
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


def search_seconds(candidates: int, backward: int, timings: list[Timing], search_windows: int) -> float:
    """A search's time at every target: each candidate a forward on every search window, except a descent step's
    gradient windows, which take a gradient pass instead."""
    forward = sum(t.forward_seconds for t in timings)
    gradient = sum(t.gradient_seconds for t in timings)
    step = (search_windows - HOLDOUT_WINDOWS) * gradient + HOLDOUT_WINDOWS * forward
    return (candidates - backward) * search_windows * forward + backward * step


def table_seconds(timings: list[Timing], tuning_settings: dict[int, int], search_windows: int, test_windows: int):
    return sum(
        t.forward_seconds * (tuning_settings[t.length] * search_windows + TABLE_ROWS * test_windows) for t in timings
    )


def ga_budget(seconds: float, timings: list[Timing], search_windows: int, max_generations: int) -> SearchBudget | None:
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
            plan = search_plan(SearchConfig.model_validate(search), len(SEEDS))
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


def descent_budget(seconds: float, timings: list[Timing], search_windows: int, max_steps: int) -> SearchBudget | None:
    """Gradient descent from the best seed with as many steps as fit (at most `max_steps`, the default 60)."""
    from longrope.search.config.search_section import SearchConfig
    from longrope.search.optimizers.factory import search_plan

    best = None
    for steps in range(1, max_steps + 1):
        search = {
            "optimizer": "gradient",
            "seeds": list(SEEDS),
            "gradient": {"steps": steps, "holdout_windows": HOLDOUT_WINDOWS},
        }
        plan = search_plan(SearchConfig.model_validate(search), len(SEEDS))
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
    search_windows: int,
    test_windows: int,
    max_generations: int = 40,
    max_steps: int = 60,
) -> Plan:
    """The table first; the rest two thirds GA, a third descent (None where not one generation or step fits)."""
    table = table_seconds(timings, tuning_settings, search_windows, test_windows)
    left = budget_seconds - table
    if left <= 0:
        note = f"the table alone needs {table:.0f} s of the {budget_seconds:.0f} s left: no search"
        return Plan(budget_seconds=budget_seconds, table_seconds=table, ga=None, descent=None, note=note)
    ga = ga_budget(left * GA_SHARE, timings, search_windows, max_generations)
    descent = descent_budget(left - (ga.seconds if ga else 0.0), timings, search_windows, max_steps)
    parts = [f"table {table:.0f} s"]
    polish = f" (the last {POLISH_STEPS + 1} its polish)"
    parts.append(f"GA {ga.candidates} candidates{polish}, {ga.seconds:.0f} s" if ga else "no GA generation fits")
    parts.append(
        f"descent {descent.backward_steps} steps, {descent.seconds:.0f} s" if descent else "no descent step fits"
    )
    note = f"of {budget_seconds:.0f} s: " + "; ".join(parts)
    return Plan(budget_seconds=budget_seconds, table_seconds=table, ga=ga, descent=descent, note=note)
