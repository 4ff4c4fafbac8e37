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
window-equivalents, a point per arm with its paired interval to YaRN carried onto perplexity, and a line per arm
through its best-so-far: `arm_curves.py`, which also writes the earlier bests as files for the table to score).

Each entry also reads its curve at equal cost (the cheapest arm's total: what each arm had found by then) and at the
cost where it first beat YaRN on the search windows (YaRN: the run's own YaRN seed). An arm that continues another
(`--continues hybrid=ga`: the hybrid's polish starts from the GA's end) is charged the other's cost as well, and its
curve starts with the other's. An arm known only by a results file has no history: its curve is its best seed and
its end (each descent candidate reads the same windows, so its seeds cost seeds x forward_windows / candidates).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from arm_curves import BACKWARD_WEIGHT, CurvePoint, arm_curve, seed_row
from benchlib import RESULTS, provenance, run_status, save_json

from longrope.search.reports.compare_rows import factors_rows
from longrope.search.reports.intervals import paired_difference

TARGET, SHORT = "16384", "8192"


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
    """The arm's cost and test scores (its curve is added by `with_curve`)."""
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


def results_file_curve(source: Path, methods: dict, end: dict) -> list[CurvePoint]:
    """An arm known only by its results file: its best seed (from the closed form's row; the default attention mode
    is LongRoPE's) at what the seeds cost, and its end."""
    search = json.loads(source.read_text())["search"]
    seeds = search["seed_perplexities"]
    seed = min(seeds, key=seeds.get)
    per_candidate = search["forward_windows"] / search["evaluations"]
    row = seed_row(seed, "longrope", methods)
    test = methods[row]["perplexity"][TARGET][0] if row else None
    first = CurvePoint(len(seeds) * per_candidate, seeds[seed], "", seed, row, test)
    last = CurvePoint(end["window_equivalents"], end["search_ppl"], search["best_key"], None, end["row"])
    return [first, CurvePoint(**{**last.as_json(), "test_ppl_16k": end["test_ppl_16k"][0]})]


CHARGED = ("candidates", "forward_windows", "backward_windows", "window_equivalents", "hours")


def with_curve(entry: dict, methods: dict, earlier: dict | None, equal_cost: float) -> None:
    """The entry gains its curve, its point at `equal_cost` and where it first beat its YaRN seed on the search
    windows. An arm that continues an `earlier` one is charged its costs too, and its curve starts with the
    earlier's."""
    source, export = Path(entry["run"]), Path(entry["factors"])
    if earlier is not None:
        before = [CurvePoint(**point) for point in earlier["curve"]]
        curve = arm_curve(source, export, methods, TARGET, before, earlier["window_equivalents"])
        entry["continues"] = {"arm": earlier["arm"], **{field: earlier[field] for field in CHARGED}}
        for field in CHARGED:
            both = (entry[field], earlier[field])
            entry[field] = None if None in both else sum(both)
    elif source.is_dir():
        curve = arm_curve(source, export, methods, TARGET)
    else:
        curve = results_file_curve(source, methods, entry)
    yarn = next((p.search_ppl for p in curve if p.seed == "yarn"), None)
    entry["curve"] = [point.as_json() for point in curve]
    within = [p for p in curve if p.window_equivalents <= equal_cost]
    entry["at_equal_cost"] = within[-1].as_json() if within else None
    beaten = [p for p in curve if yarn is not None and p.search_ppl < yarn]
    entry["first_beat_yarn"] = beaten[0].as_json() if beaten else None
    # a results file keeps no steps: where it first beat YaRN is known only to be at or before its end
    entry["curve_steps_kept"] = source.is_dir()


def own_part(entry: dict) -> list[dict]:
    """The curve as drawn: an arm that continues another starts where the other ended, from its best (the rest is
    drawn already, as the other's)."""
    curve = entry["curve"]
    if "continues" not in entry:
        return curve
    spent = entry["continues"]["window_equivalents"]
    start = max(i for i, p in enumerate(curve) if p["window_equivalents"] <= spent)
    return [{**curve[start], "window_equivalents": spent}, *curve[start + 1 :]]


def plot(entries: list[dict], methods: dict, path: Path) -> None:
    """Left: each arm's best so far on its search windows against window-equivalents (a step line from its
    history), as a ratio to its own YaRN seed on those windows: arms searched on other windows (descent on 4
    gradient windows) read other perplexities, and the ratio is what compares across them. Right: the same bests on
    the test windows at 16k where the table scored them, a line per arm, the last point with its paired interval to
    the best closed form (YaRN with LongRoPE's attention factor; an older table: YaRN) moved onto perplexity (that
    row's perplexity x exp(interval)); both closed forms as horizontal lines."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.8), layout="constrained")
    search_ax, test_ax = fig.subplots(1, 2)
    reference = "yarn_longrope_attention" if "yarn_longrope_attention" in methods else "yarn"
    reference_ppl = methods[reference]["perplexity"][TARGET][0]
    for entry in entries:
        curve = own_part(entry)
        yarn_seed = _yarn_seed(entry)
        costs, search = [p["window_equivalents"] for p in curve], [p["search_ppl"] / yarn_seed for p in curve]
        search_ax.step([*costs, entry["window_equivalents"]], [*search, search[-1]], where="post", label=entry["arm"])
        tested = [p for p in curve if p["test_ppl_16k"] is not None]
        line = test_ax.plot([p["window_equivalents"] for p in tested], [p["test_ppl_16k"] for p in tested], "o-")[0]
        line.set_label(entry["arm"])
        ppl, (_, low, high) = entry["test_ppl_16k"][0], entry[f"delta_vs_{reference}"]
        bounds = np.array([[ppl - reference_ppl * math.exp(low)], [reference_ppl * math.exp(high) - ppl]]).clip(0)
        test_ax.errorbar([curve[-1]["window_equivalents"]], [ppl], yerr=bounds, color=line.get_color(), capsize=3)
    yarn = methods["yarn"]["perplexity"][TARGET][0]
    test_ax.axhline(yarn, color="0.4", linestyle=":", label=f"YaRN ({yarn:.3f})")
    if reference != "yarn":
        label = f"YaRN, LongRoPE's attention ({reference_ppl:.3f})"
        test_ax.axhline(reference_ppl, color="0.6", linestyle="--", label=label)
    # PI's seed reads several times worse and would flatten the rest: the axis ends just above the YaRN seeds' 1
    lowest = min(p["search_ppl"] / _yarn_seed(e) for e in entries for p in e["curve"])
    search_ax.set_ylim(lowest - 0.2 * (1.005 - lowest), 1.005)
    search_ax.axhline(1.0, color="0.4", linestyle=":", label="its YaRN seed")
    labels = ("best so far: perplexity on its search windows / its YaRN seed's", "best so far: perplexity, test, 16k")
    for ax, label in zip((search_ax, test_ax), labels, strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("window-equivalents spent (forward + 2 x backward; log)")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    bar = "YaRN, LongRoPE's attention" if reference != "yarn" else "YaRN"
    fig.suptitle(f"SmolLM2-135M 8k -> 16k: each arm's best so far against its cost; bar: paired 95% to {bar}")
    fig.savefig(path, dpi=120)


def _yarn_seed(entry: dict) -> float:
    """The arm's YaRN seed on its own search windows (an arm that continues another: the other's)."""
    return next(p["search_ppl"] for p in entry["curve"] if p["seed"] == "yarn")


def add_curves(entries: list[dict], methods: dict, continues: dict[str, str]) -> None:
    """Each entry's curve (`with_curve`), in the order given, so that an arm that continues another finds it done;
    equal cost is the cheapest total among arms that continue none."""
    equal_cost = min(e["window_equivalents"] for e in entries if e["arm"] not in continues)
    done: dict[str, dict] = {}
    for entry in entries:
        earlier = continues.get(entry["arm"])
        if earlier is not None and earlier not in done:
            raise SystemExit(f"--continues {entry['arm']}={earlier}: no earlier --arm {earlier}")
        with_curve(entry, methods, done.get(earlier), equal_cost)
        done[entry["arm"]] = entry


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
    parser.add_argument(
        "--continues",
        action="append",
        default=[],
        metavar="ARM=EARLIER",
        help="ARM started from EARLIER's end (the hybrid's polish from the GA): charged EARLIER's cost too",
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
    add_curves(entries, methods, dict(pair.split("=", 1) for pair in args.continues))
    out = Path(args.out)
    save_json(out, {**provenance(), "table": args.table, "windows": table["windows"], "arms": entries})
    plot(entries, methods, out.with_suffix(".png"))
    for entry in entries:
        print(
            f"{entry['arm']}: {entry['candidates']} candidates, {entry['window_equivalents']} window-equivalents, "
            f"test ppl 16k {entry['test_ppl_16k'][0]:.3f}, vs YaRN {entry['delta_vs_yarn'][0]:+.4f} "
            f"[{entry['delta_vs_yarn'][1]:+.4f}, {entry['delta_vs_yarn'][2]:+.4f}]"
        )
        for what in ("at_equal_cost", "first_beat_yarn"):
            point = entry[what]
            if point is not None:
                unknown = what == "first_beat_yarn" and not entry["curve_steps_kept"]
                bound = " (at the latest: its steps are not kept)" if unknown else ""
                test = "not scored" if point["test_ppl_16k"] is None else f"{point['test_ppl_16k']:.3f}"
                print(
                    f"  {what}: {point['window_equivalents']:g} window-equivalents, search ppl "
                    f"{point['search_ppl']:.4f}, test ppl 16k {test}{bound}"
                )


if __name__ == "__main__":
    main()
