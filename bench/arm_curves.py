"""Issue 39's best-so-far curves: each arm's best candidate so far against the window-equivalents it had spent, on the
search windows (its history.jsonl: free) and on the held-out test windows (where that best-so-far was scored).

Why the test points are written as files: the test scores come from `bench/real_model.py table`, which scores
factors files (`--factors`) and logs every forward, so each new row costs only its own forwards. Run as a script,
this writes every best-so-far of a run before its last (the last is the run's export) as a factors file beside the
export, `<export stem>_best_<key>.json` (`candidate_factors_file`: the export's own writer, its provenance naming
the candidate), and prints them as `--factors` arguments for the table:

  .venv/bin/python bench/arm_curves.py bench/results/smollm2_16k_ga_run bench/results/smollm2_16k_ga_factors.json

bench/optimizer_arms.py then reads the curves (`arm_curve`) and finds each point's test score in the table. A point
that is a seed is read from the closed form's own row (`<seed>_longrope_attention` when the run searched with
LongRoPE's attention factor): the seed is that closed form rounded to the search's 0.01 grid, so its row is the
unrounded closed form, and the point says which row it took.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from longrope.search.export.factors_export import candidate_factors_file, factors_of_path, write_export
from longrope.search.run.run_check import CheckedRun, read_run
from longrope.search.run.run_store import RunDir
from longrope.search.run.trajectory import cost_trajectory

BACKWARD_WEIGHT = 2  # a gradient pass counted as 2 forwards beyond its own, as `status --json` counts


@dataclass(frozen=True)
class CurvePoint:
    """The arm's best so far once it had spent `window_equivalents`: its search-window perplexity, its history key
    and seed name (None: found by the search), and its test perplexity at 16k where the table has its row."""

    window_equivalents: float
    search_ppl: float
    key: str
    seed: str | None
    test_row: str | None = None
    test_ppl_16k: float | None = None

    def as_json(self) -> dict:
        return asdict(self)


def best_so_far(run_dir: Path, offset: float = 0.0) -> list[CurvePoint]:
    """A point each time the run's best improved (`cost_trajectory`, the rule status and export use), its cost
    shifted by `offset` (an arm that continues another: the hybrid's polish after the GA)."""
    points, best_key = [], None
    for step in cost_trajectory(RunDir(run_dir), BACKWARD_WEIGHT):
        if step.best is not None and step.best.key != best_key:
            best_key = step.best.key
            ppl = math.exp(step.best.mean_nll)
            points.append(CurvePoint(offset + step.cost, ppl, best_key, step.best.seed))
    return points


def point_file(export: Path, key: str) -> Path:
    return export.with_name(f"{export.stem}_best_{key}.json")


def write_points(run: CheckedRun, export: Path) -> list[Path]:
    """Each best-so-far but the last as a factors file beside the export; the last must be the export's candidate
    (otherwise the export is of another run, or older than the run's history)."""
    points = best_so_far(run.run_dir.path)
    exported = candidate_key(export)
    if points[-1].key != exported:
        raise SystemExit(f"{export}: exports candidate {exported}, but the run's best is {points[-1].key}")
    paths = []
    for point in points[:-1]:
        if point.seed is None:  # a seed's point is its closed form's own row of the table
            paths += write_export(point_factors(run, point.key), point_file(export, point.key), "json")
    return paths


def point_factors(run: CheckedRun, key: str):
    """The candidate's factors file, its provenance saying where the run stood when it was found (candidates done up
    to and including it, its generation, unfinished), not where the run ended."""
    factors = candidate_factors_file(run, run.records[key])
    keys = list(run.records)
    done = sum(1 for k in keys[: keys.index(key) + 1] if run.records[k].final)
    generation = run.records[key].generation
    update = {"finished": False, "evaluations": done, "generation": generation}
    return factors.model_copy(update={"provenance": factors.provenance.model_copy(update=update)})


def candidate_key(export: Path) -> str:
    return factors_of_path(export).provenance.best_key


def row_of(path: Path, methods: dict) -> str | None:
    """The table's row for a factors file (compare labels a file `file:` plus the end of its path, whole names only),
    or None."""
    whole = "/" + path.as_posix()
    rows = [label for label in methods if label.startswith("file:") and whole.endswith("/" + label[5:])]
    return max(rows, key=len) if rows else None


def same_candidate_row(key: str, methods: dict) -> str | None:
    """Another arm's point file of the same candidate (`..._best_<key>.json`): a key is the hash of the genome's grid
    steps, so two runs of one config that found the same key (the screened GA shares the GA's generation 0, same
    seed) found the same factors, and the table need not score them twice. The point's `test_row` names the row."""
    rows = [label for label in methods if label.startswith("file:") and label.endswith(f"_best_{key}.json")]
    return min(rows) if rows else None


def seed_row(seed: str, attention_mode: str, methods: dict) -> str | None:
    row = f"{seed}_longrope_attention" if attention_mode == "longrope" else seed
    return row if row in methods else None


def with_test_scores(points: list[CurvePoint], export: Path, attention_mode: str, methods: dict, target: str):
    """The points with their test perplexity where the table scored them: a seed from its closed form's row, the
    last from the export's row, any other from its `point_file` (or another arm's of the same candidate)."""
    scored = []
    for i, point in enumerate(points):
        if point.seed is not None:
            row = seed_row(point.seed, attention_mode, methods)
        elif i == len(points) - 1:
            row = row_of(export, methods)
        else:
            row = row_of(point_file(export, point.key), methods) or same_candidate_row(point.key, methods)
        ppl = methods[row]["perplexity"][target][0] if row else None
        scored.append(CurvePoint(**{**asdict(point), "test_row": row, "test_ppl_16k": ppl}))
    return scored


def arm_curve(run_dir: Path, export: Path, methods: dict, target: str, before: Sequence[CurvePoint] = (), spent=0.0):
    """The arm's curve, test scores included; `before`: the curve of the arm this one continues, which had spent
    `spent` window-equivalents in all (its points come first, and this arm's costs start where it ended)."""
    mode = read_run(RunDir(run_dir)).config.search.attention_factor.mode
    own = best_so_far(run_dir, spent)
    if before:  # its start is the earlier arm's best, scored again: only what improves on it is this arm's
        own = [point for point in own if point.search_ppl < before[-1].search_ppl]
    own = with_test_scores(own, export, mode, methods, target)
    return [*before, *own]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the arm's run directory")
    parser.add_argument("export", type=Path, help="its export (`longrope export RUN -o FILE`)")
    args = parser.parse_args()
    paths = write_points(read_run(RunDir(args.run)), args.export)
    print(" ".join(f"--factors {path}" for path in paths) or "no best-so-far before the last that is not a seed")


if __name__ == "__main__":
    main()
