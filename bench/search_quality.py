"""Search quality: plain LongRoPE search against LongRoPE2's space and objectives, progressive stages and short
factors, side by side in one run on the reference model at the demo's scale (128 -> 1024 tokens, 8x).

1. space x objective: every combination of search.space {longrope, longrope2} and data.objective {perplexity,
   tail, needle}, each searched as configs/demo.yaml searches (same seed, budget, racing, early stop). The best of
   each is read on the test split at 1024: perplexity (ratio to plain LongRoPE's, paired NLL difference with its
   95% interval) and needle retrieval on held-out needles (exact-match accuracy, paired difference in accuracy
   to plain LongRoPE with a 95% normal interval over needles, and answer NLL).
2. progressive: search.stages [256, 512] then 1024 (2x -> 4x -> 8x), against plain 8x search: window evaluations
   and forward tokens in all, evaluations until the last stage's best search NLL reaches plain 8x's final one,
   and test perplexity (paired interval).
3. short factors: plain 8x's export as `search.long_factors`, a short-factor search at 128; test perplexity at 128
   of the unscaled model, of the export as it is (short factors all ones, the attention factor applied), and with
   the searched short factors; and at 1024, where the long factors must be unchanged.

Writes search_quality.json and search_quality.png (needle answer NLL against test perplexity per variant, with
paired intervals: accuracy alone cannot rank variants that all retrieve nothing).
Run: .venv/bin/python bench/search_quality.py [--seed 0] [--needles 64] [--out bench/results] [--set FIELD=VALUE]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import ray
import torch
from benchlib import history_trajectory
from rich.console import Console

from longrope.encodings import RopeMethod
from longrope.search.export.factors_export import factors_file_of_run
from longrope.search.job.job_context import JobContext
from longrope.search.job.jobs import run_search
from longrope.search.optimizers.factory import load_job_config
from longrope.search.optimizers.history_record import HistoryRecord
from longrope.search.reports.compare_scoring import score_all, window_means
from longrope.search.reports.intervals import interval, paired_difference
from longrope.search.run.run_store import RunDir
from longrope.search.run.stages import stage_configs

ROOT = Path(__file__).resolve().parent.parent
PLAIN = "longrope/perplexity"
COMBINATIONS = {
    f"{space}/{objective}": [f"search.space={space}", f"data.objective={objective}"]
    for space in ("longrope", "longrope2")
    for objective in ("perplexity", "tail", "needle")
}
PROGRESSIVE = ["search.stages=[256, 512]"]


def search(name: str, overrides: list[str], seed: int, work: Path, settings: list[str]) -> dict:
    """One search as configs/demo.yaml runs it with `overrides`, then `settings` (the command's --set, for every
    search), the seed and a folder of its own."""
    out = work / name.replace("/", "-")
    config = load_job_config(
        ROOT / "configs/demo.yaml", [*overrides, *settings, f"search.seed={seed}", f"output_dir={out}"]
    )
    started = time.perf_counter()
    best = run_search(config)
    wall = time.perf_counter() - started
    folders = [Path(c.output_dir) for c in stage_configs(config)] if config.search.stages else [out]
    points = [history_trajectory(folder) for folder in folders]
    lengths = [RunDir(folder).read_config().target_length for folder in folders]
    return {
        "config": config,
        "best": best,
        "wall_s": wall,
        "dir": out,
        "evaluations": sum(p[-1][0] for p in points),
        "forward_tokens": sum(p[-1][0] * n for p, n in zip(points, lengths, strict=True)),
        "points": points,
    }


def best_method(context: JobContext, best: HistoryRecord) -> RopeMethod:
    return context.longrope(torch.tensor(best.factors), attention_factor=best.attention_factor)


def test_reading(context: JobContext, methods: dict[str, RopeMethod], needles: int) -> dict[str, dict]:
    """Per-window test NLL at the target, and per-needle hits and answer NLL, for every method on the same
    windows and needles."""
    data, n = context.config.data, context.target_length
    perplexity = score_all(context, methods, data.test_source, n, data.test_windows)
    needle = score_all(context, methods, data.test_source, n, needles, "needle")
    return {
        name: {
            "nll": window_means(perplexity[name]),
            "hits": np.asarray([m == 0 for m in needle[name].misses], dtype=np.float64),
            "answer_nll": window_means(needle[name]),
        }
        for name in methods
    }


def paired_share(a: np.ndarray, b: np.ndarray) -> list[float]:
    """Mean paired difference of two 0/1 outcomes on the same needles, with a 95% normal interval."""
    return list(interval(a - b))


def combination_rows(runs: dict, reading: dict) -> list[dict]:
    plain = reading[PLAIN]
    rows = []
    for name, run in runs.items():
        mine = reading[name]
        rows.append(
            {
                "variant": name,
                "search_score": run["best"].perplexity,
                "window_evaluations": run["evaluations"],
                "forward_tokens": run["forward_tokens"],
                "wall_s": run["wall_s"],
                "test_ppl": math.exp(float(mine["nll"].mean())),
                "test_ppl_ratio_to_plain": math.exp(float(mine["nll"].mean() - plain["nll"].mean())),
                "test_dnll_vs_plain": list(paired_difference(mine["nll"], plain["nll"])),
                "needle_accuracy": float(mine["hits"].mean()),
                "needle_accuracy_vs_plain": paired_share(mine["hits"], plain["hits"]),
                "answer_nll": float(mine["answer_nll"].mean()),
                "answer_nll_vs_plain": list(paired_difference(mine["answer_nll"], plain["answer_nll"])),
                "factors": run["best"].factors,
                "attention_factor": run["best"].attention_factor,
            }
        )
    return rows


def progressive_row(progressive: dict, plain: dict, reading: dict) -> dict:
    target = plain["best"].mean_nll
    spent_before_last = sum(p[-1][0] for p in progressive["points"][:-1])
    last = progressive["points"][-1]
    reach = next((spent_before_last + e for e, b in last if b <= target + 1e-12), None)
    return {
        "window_evaluations": progressive["evaluations"],
        "forward_tokens": progressive["forward_tokens"],
        "plain_window_evaluations": plain["evaluations"],
        "plain_forward_tokens": plain["forward_tokens"],
        "evaluations_to_plain_final": reach,
        "ratio_to_plain_spend": None if reach is None else reach / plain["evaluations"],
        "test_ppl": math.exp(float(reading["progressive"]["nll"].mean())),
        "test_dnll_vs_plain": list(paired_difference(reading["progressive"]["nll"], reading[PLAIN]["nll"])),
        "needle_accuracy": float(reading["progressive"]["hits"].mean()),
        "answer_nll": float(reading["progressive"]["answer_nll"].mean()),
        "wall_s": progressive["wall_s"],
    }


def short_factor_row(plain: dict, seed: int, work: Path, settings: list[str]) -> dict:
    """Plain 8x's export kept as the long factors; its short factors searched at 128."""
    long_file = work / "plain-8x.json"
    long_file.write_text(factors_file_of_run(RunDir(plain["dir"])).model_dump_json())
    # the attention factor is the long factors' (transformers applies it in both regimes): not searched here
    overrides = ["search.factor=short", f"search.long_factors={long_file}", "search.attention_factor.mode=longrope"]
    short = search("short", overrides, seed, work, settings)
    exported = factors_file_of_run(RunDir(short["dir"])).rope_parameters
    context = JobContext.resolve(short["config"])
    kept = context.longrope(exported.long_factor, attention_factor=exported.attention_factor)
    searched = context.longrope(
        exported.long_factor, attention_factor=exported.attention_factor, short_factor=exported.short_factor
    )
    methods = {"unscaled": context.baselines()["none"], "export_as_is": kept, "short_searched": searched}
    data = context.config.data
    result = {}
    for length in (context.original_length, context.target_length):
        scores = score_all(context, methods, data.test_source, length, data.test_windows)
        result[str(length)] = {name: window_means(score) for name, score in scores.items()}
    at_original = result[str(context.original_length)]
    at_target = result[str(context.target_length)]
    ppl = {name: math.exp(float(values.mean())) for name, values in at_original.items()}
    return {
        "ppl_at_original": ppl,
        "short_ratio_to_unscaled": ppl["short_searched"] / ppl["unscaled"],
        "export_ratio_to_unscaled": ppl["export_as_is"] / ppl["unscaled"],
        "ppl_at_target": {name: math.exp(float(values.mean())) for name, values in at_target.items()},
        "target_identical": bool(np.array_equal(at_target["export_as_is"], at_target["short_searched"])),
        "short_factor": exported.short_factor,
        "window_evaluations": short["evaluations"],
    }


def plot(rows: list[dict], progressive: dict, path: Path) -> None:
    """Needle answer NLL (nats per answer token; 7 ln 10 / 8 = 2.01 is a uniform guess over the digits) against test
    perplexity, each with its paired 95% interval against plain LongRoPE: lower left is better on both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 5))
    plain_ppl = next(r["test_ppl"] for r in rows if r["variant"] == PLAIN)
    plain_answer = next(r["answer_nll"] for r in rows if r["variant"] == PLAIN)
    for row in rows:
        d, a = row["test_dnll_vs_plain"], row["answer_nll_vs_plain"]
        x_err = [[row["test_ppl"] - plain_ppl * math.exp(d[1])], [plain_ppl * math.exp(d[2]) - row["test_ppl"]]]
        y_err = [[row["answer_nll"] - (plain_answer + a[1])], [plain_answer + a[2] - row["answer_nll"]]]
        label = row["variant"]
        axis.errorbar(row["test_ppl"], row["answer_nll"], xerr=x_err, yerr=y_err, fmt="o", capsize=3, label=label)
    axis.plot(progressive["test_ppl"], progressive["answer_nll"], "k^", label="progressive 2x-4x-8x")
    guess = 7 * math.log(10) / 8  # the answer is " " + 7 digits: the space is free, each digit a 1-in-10 guess
    axis.axhline(guess, color="grey", linestyle=":", linewidth=1, label="uniform guess over digits")
    axis.set(
        xlabel="test perplexity at 1024 (lower is better)",
        ylabel="needle answer NLL per token at 1024 (lower is better)",
        title="search space x objective, reference model 128 -> 1024 (paired 95% vs plain)",
    )
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def print_tables(result: dict) -> None:
    console = Console(width=200)  # a table, not prose: never wrapped when piped to a log
    console.print("\n[bold]1. space x objective at 8x[/bold] (test split; Δ vs plain LongRoPE, paired 95%)")
    console.print(
        f"{'variant':22s} {'evals':>6s} {'test ppl':>8s} {'x plain':>7s} {'dNLL vs plain [95%]':>27s} "
        f"{'needle acc':>10s} {'Δacc vs plain [95%]':>26s} {'ans NLL':>7s} {'Δans NLL vs plain [95%]':>27s}"
    )
    for row in result["combinations"]:
        d, a, n = row["test_dnll_vs_plain"], row["needle_accuracy_vs_plain"], row["answer_nll_vs_plain"]
        console.print(
            f"{row['variant']:22s} {row['window_evaluations']:6d} {row['test_ppl']:8.4f} "
            f"{row['test_ppl_ratio_to_plain']:7.4f} {d[0]:+8.4f} [{d[1]:+7.4f}, {d[2]:+7.4f}] "
            f"{row['needle_accuracy']:10.3f} {a[0]:+7.3f} [{a[1]:+7.3f}, {a[2]:+7.3f}] {row['answer_nll']:7.3f} "
            f"{n[0]:+8.4f} [{n[1]:+7.4f}, {n[2]:+7.4f}]"
        )
    wins = [
        r
        for r in result["combinations"]
        if r["variant"] != PLAIN and r["needle_accuracy_vs_plain"][1] > 0 and r["test_ppl_ratio_to_plain"] <= 1.02
    ]
    console.print(
        "target (a LongRoPE2 variant beats plain on needle accuracy, paired interval above 0, test ppl <= 1.02x): "
        + ("met by " + ", ".join(r["variant"] for r in wins) if wins else "missed")
    )
    p = result["progressive"]
    console.print(
        f"\n[bold]2. progressive 2x -> 4x -> 8x[/bold]: {p['window_evaluations']} window evaluations "
        f"({p['forward_tokens']:,} tokens) vs plain 8x {p['plain_window_evaluations']} "
        f"({p['plain_forward_tokens']:,} tokens); reaches plain's final search NLL after "
        f"{p['evaluations_to_plain_final'] if p['evaluations_to_plain_final'] is not None else 'never'}; "
        f"test ppl {p['test_ppl']:.4f}, dNLL vs plain {p['test_dnll_vs_plain'][0]:+.4f} "
        f"[{p['test_dnll_vs_plain'][1]:+.4f}, {p['test_dnll_vs_plain'][2]:+.4f}]"
    )
    s = result["short"]
    ppl = s["ppl_at_original"]
    console.print(
        f"\n[bold]3. short factors[/bold] at 128: unscaled {ppl['unscaled']:.4f}, export as is "
        f"{ppl['export_as_is']:.4f} ({s['export_ratio_to_unscaled']:.4f}x), short searched "
        f"{ppl['short_searched']:.4f} ({s['short_ratio_to_unscaled']:.4f}x; target <= 1.01x); at 1024 the long "
        f"factors' perplexity is {'unchanged' if s['target_identical'] else 'CHANGED'} "
        f"({s['ppl_at_target']['export_as_is']:.4f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--needles", type=int, default=64, help="held-out needles at the target length")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override for every search")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    console = Console()
    runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        for name, overrides in {**COMBINATIONS, "progressive": PROGRESSIVE}.items():
            console.print(f"searching {name} ...")
            runs[name] = search(name, overrides, args.seed, work, args.set)
            console.print(f"  {runs[name]['evaluations']} window evaluations, {runs[name]['wall_s']:.0f} s")
        context = JobContext.resolve(runs[PLAIN]["config"])
        methods = {name: best_method(context, run["best"]) for name, run in runs.items()}
        console.print("reading every best on the test split ...")
        reading = test_reading(context, methods, args.needles)
        console.print("short-factor search ...")
        short = short_factor_row(runs[PLAIN], args.seed, work, args.set)
    combinations = {name: run for name, run in runs.items() if name != "progressive"}
    result = {
        "seed": args.seed,
        "needles": args.needles,
        "combinations": combination_rows(combinations, reading),
        "progressive": progressive_row(runs["progressive"], runs[PLAIN], reading),
        "short": short,
    }
    (args.out / "search_quality.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result["combinations"], result["progressive"], args.out / "search_quality.png")
    print_tables(result)
    console.print(f"wrote {args.out}/search_quality.json and search_quality.png")
    ray.shutdown()


if __name__ == "__main__":
    main()
