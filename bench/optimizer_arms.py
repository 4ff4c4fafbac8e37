"""Issue 39's arms on SmolLM2-135M at 8k -> 16k, one entry each: what the arm cost (candidates, forward and backward
window passes, window-equivalents = forward + 2 x backward as `status --json` counts them, hours of scoring) and what
its factors read on the held-out windows (test perplexity at 16k and 8k, the paired difference per token to YaRN and to
the shipped descent run's factors, each with its 95% interval).

Why a script of its own: the test scores come from one `bench/real_model.py table` run with every arm's export as a
`--factors` row (its score log resumes across sessions; its table is `smollm2_16k_arms.json`), while each arm's cost
comes from its run directory. This joins the two, so nothing is scored here. An arm whose run directory is gone gives a
results file that recorded its status instead (the shipped descent run: `smollm2_16k.json`'s `search`), and then its
hours are not known and are written as null.

  .venv/bin/python bench/optimizer_arms.py \\
    --arm descent gradient bench/results/smollm2_16k_factors.json bench/results/smollm2_16k.json \\
    --arm ga dim_mono bench/results/smollm2_16k_ga_factors.json bench/results/smollm2_16k_ga_run

writes bench/results/smollm2_16k_optimizers.json and smollm2_16k_optimizers.png (test perplexity at 16k against
window-equivalents, a point per arm with its paired interval to YaRN carried onto perplexity).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from benchlib import RESULTS, provenance, run_status, save_json

from longrope.search.reports.compare_rows import factors_rows
from longrope.search.reports.intervals import paired_difference

TARGET, SHORT = "16384", "8192"
BACKWARD_WEIGHT = 2  # a gradient pass counted as 2 forwards beyond its own, as `status --json` and issue 39 count


def arm_cost(source: Path) -> dict:
    """The arm's status (a run directory's `longrope status --json`, or the `search` a results file recorded) and
    its hours of scoring (state.json's generation and polish seconds; null where no run directory is left)."""
    if source.is_dir():
        status, state = run_status(source), json.loads((source / "state.json").read_text())
        seconds = sum(state.get("generation_seconds") or []) + sum(state.get("polish_seconds") or [])
        return {**status, "hours": seconds / 3600}
    return {**json.loads(source.read_text())["search"], "hours": None}


def paired(methods: dict, row: str, other: str, length: str) -> list[float] | None:
    """The paired difference row - other at `length` (None where the table has no such row: an older table)."""
    if other not in methods:
        return None
    a, b = methods[row]["nll_per_window"][length], methods[other]["nll_per_window"][length]
    return list(paired_difference(a, b))


def arm_entry(name: str, optimizer: str, row: str, factors: str, source: Path, methods: dict, reference_row: str):
    cost = arm_cost(source)
    forward, backward = cost["forward_windows"], cost["backward_windows"]
    return {
        "arm": name,
        "optimizer": optimizer,
        "row": row,
        "factors": factors,
        "run": str(source),
        "candidates": cost["evaluations"],
        "forward_windows": forward,
        "backward_windows": backward,
        "window_equivalents": forward + BACKWARD_WEIGHT * backward,
        "hours": cost["hours"],
        "search_ppl": cost["best_perplexity"],
        "test_ppl_16k": methods[row]["perplexity"][TARGET],
        "test_ppl_8k": methods[row]["perplexity"].get(SHORT),
        "delta_vs_yarn": paired(methods, row, "yarn", TARGET),
        "delta_vs_yarn_longrope_attention": paired(methods, row, "yarn_longrope_attention", TARGET),
        "delta_vs_descent": paired(methods, row, reference_row, TARGET),
    }


def plot(entries: list[dict], methods: dict, path: Path) -> None:
    """Test perplexity at 16k against window-equivalents, a point per arm; the bar is the paired interval to YaRN
    moved onto perplexity (YaRN's perplexity x exp(interval)), and YaRN's own perplexity is a dotted line."""
    from matplotlib.figure import Figure

    yarn = methods["yarn"]["perplexity"][TARGET][0]
    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for entry in entries:
        ppl = entry["test_ppl_16k"][0]
        _, low, high = entry["delta_vs_yarn"]
        bounds = np.array([[ppl - yarn * math.exp(low)], [yarn * math.exp(high) - ppl]]).clip(0)
        ax.errorbar([entry["window_equivalents"]], [ppl], yerr=bounds, fmt="o", capsize=3, label=entry["arm"])
    ax.axhline(yarn, color="0.4", linestyle=":", label=f"YaRN ({yarn:.3f})")
    ax.set_xscale("log")
    ax.set_xlabel("window-equivalents spent (forward + 2 x backward window passes; log scale)")
    ax.set_ylabel("test perplexity at 16k (8 windows; lower is better)")
    ax.set_title("SmolLM2-135M 8k -> 16k: each arm's best; bars: paired 95% interval to YaRN", fontsize=10)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--arm",
        nargs=4,
        action="append",
        required=True,
        metavar=("NAME", "OPTIMIZER", "FACTORS", "RUN"),
        help="an arm: its name, optimizer, its export (a --factors of the table) and its run directory (or a results "
        "JSON)",
    )
    parser.add_argument("--table", default=str(RESULTS / "smollm2_16k_arms.json"))
    parser.add_argument("--out", default=str(RESULTS / "smollm2_16k_optimizers.json"))
    args = parser.parse_args()
    table = json.loads(Path(args.table).read_text())
    methods = table["result"]["methods"]
    # each export's row as the table labelled it: compare's labels of the same --factors paths (`factors_rows`)
    rows = {path: label for label, path in factors_rows([factors for _, _, factors, _ in args.arm]).items()}
    missing = [path for path, label in rows.items() if label not in methods]
    if missing:
        raise SystemExit(f"--arm: {missing[0]!r} is not a row of {args.table} (rows: {', '.join(methods)})")
    reference_row = rows[args.arm[0][2]]  # the first arm is the one the others are compared with (shipped descent)
    entries = [arm_entry(n, o, rows[f], f, Path(run), methods, reference_row) for n, o, f, run in args.arm]
    out = Path(args.out)
    save_json(out, {**provenance(), "table": args.table, "windows": table["windows"], "arms": entries})
    plot(entries, methods, out.with_suffix(".png"))
    for entry in entries:
        print(
            f"{entry['arm']}: {entry['candidates']} candidates, {entry['window_equivalents']} window-equivalents, "
            f"test ppl 16k {entry['test_ppl_16k'][0]:.3f}, vs YaRN {entry['delta_vs_yarn'][0]:+.4f} "
            f"[{entry['delta_vs_yarn'][1]:+.4f}, {entry['delta_vs_yarn'][2]:+.4f}]"
        )


if __name__ == "__main__":
    main()
