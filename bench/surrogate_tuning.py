"""search.surrogate's defaults, chosen on training seeds (never the benchmark's): the GA against screened variants.

Each arm runs `longrope search configs/demo.yaml` (the reference model, 128 -> 1024, 8 search windows) on every
training seed, and is judged on what the search itself sees: its best search-split perplexity and the window
evaluations it spent (the test split is bench/search_cost.py's). The control arm `fewer_children` scores as few
children as the screened arms (half the demo's 16 a generation) without a surrogate, so what the surrogate adds is
read apart from what halving the children does on its own.

Also an offline probe of the surrogate's model on the GA's own runs: for each generation g >= 1,
fit on every candidate scored before g, predict g's children, and report the rank correlation with their true
scores and whether the generation's best child is among the top half predicted; ridge on (log factors, their
squares, attention factor, n_hat) against ridge on the log factors alone and a Gaussian process (RBF kernel,
length scale the median distance: the package's own surrogates, `fit_surrogate`).

    .venv/bin/python bench/surrogate_tuning.py [--seeds 100 101 102] [--arms ...] [--work DIR]

Runs are kept in --work (default runs/surrogate-tuning) and a finished one is read back, not rerun.
Saves bench/results/surrogate_tuning.json and .png.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import matplotlib
import numpy as np
from benchlib import ROOT, provenance, save_json
from rich.console import Console

from longrope.search.job.jobs import run_search
from longrope.search.optimizers.factory import load_job_config
from longrope.search.optimizers.surrogate import fit_surrogate

matplotlib.use("Agg")
import matplotlib.pyplot as plt

GA = ["search.optimizer=dim_mono", "search.schedule=generational", "search.racing.enabled=false"]
ON = [*GA, "search.surrogate.enabled=true"]
ARMS = {  # the demo's 8 mutations + 8 crossovers; search.surrogate's defaults unless an arm names one
    "official_ga": GA,
    "fewer_children": [*GA, "search.mutations=4", "search.crossovers=4"],  # the control: half, unscreened
    "screened_p2": [*ON, "search.surrogate.proposals=2"],
    "screened_p4": [*ON, "search.surrogate.proposals=4"],
    "screened_p8": [*ON, "search.surrogate.proposals=8"],
    "screened_p4_no_exploration": [*ON, "search.surrogate.proposals=4", "search.surrogate.exploration=0"],
    "screened_p4_quarter": [*ON, "search.surrogate.proposals=4", "search.surrogate.scored_share=0.25"],
    "screened_p4_all_children": [*ON, "search.surrogate.proposals=4", "search.surrogate.scored_share=1"],
    "screened_p8_gp": [*ON, "search.surrogate.proposals=8", "search.surrogate.model=gaussian_process"],
}


def run_arm(arm: str, seed: int, work: Path) -> dict:
    out = work / f"{arm}-seed{seed}"
    state = out / "state.json"
    if out.exists() and not (state.is_file() and json.loads(state.read_text()).get("finished")):
        run_search(None, resume_dir=out)  # a run stopped part-way: resumed, to the same result
    elif not out.exists():
        config = load_job_config(ROOT / "configs/demo.yaml", [*ARMS[arm], f"search.seed={seed}", f"output_dir={out}"])
        run_search(config)
    records = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    scored = [r for r in records if r.get("status") == "scored" and r["mean_nll"] is not None]
    best = min(scored, key=lambda r: (r["mean_nll"], r["key"]))
    generations = max(r["generation"] for r in records)
    return {"search_ppl": best["perplexity"], "evaluations": len(records), "generations": generations, "run": str(out)}


# ---- the offline probe ----


def features(record: dict, squares: bool) -> np.ndarray:
    logs = np.log(np.asarray(record["factors"], dtype=np.float64))
    extra = [record["attention_factor"], float(record["n_hat"])]
    return np.concatenate([logs, logs**2, extra] if squares else [logs, extra])


MODELS = ("ridge_log_and_squares", "ridge_log_only", "gaussian_process")


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def probe(run_dir: Path) -> dict[str, dict]:
    records = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    records = [r for r in records if r["mean_nll"] is not None]
    out: dict[str, dict] = {}
    for name in MODELS:
        squares = name != "ridge_log_only"
        correlations, best_kept = [], []
        for generation in range(1, max(r["generation"] for r in records) + 1):
            train = [r for r in records if r["generation"] < generation]
            children = [r for r in records if r["generation"] == generation]
            if len(children) < 4:
                continue
            x = np.stack([features(r, squares) for r in train])
            y = np.array([r["mean_nll"] for r in train])
            t = np.stack([features(r, squares) for r in children])
            truth = np.array([r["mean_nll"] for r in children])
            model = "gaussian_process" if name == "gaussian_process" else "ridge"
            predicted = fit_surrogate(model, x, y, ridge=1.0, noise=1e-3).predict(t)
            correlations.append(spearman(predicted, truth))
            top_half = set(np.argsort(predicted, kind="stable")[: len(children) // 2])
            best_kept.append(int(np.argmin(truth)) in top_half)
        out[name] = {
            "rank_correlation_mean": float(np.mean(correlations)),
            "rank_correlation_min": float(np.min(correlations)),
            "best_child_in_top_half": f"{sum(best_kept)}/{len(best_kept)}",
        }
    return out


# ---- the run ----


def plot(rows: list[dict], path: Path) -> None:
    figure, axis = plt.subplots(figsize=(8, 5))
    for arm in ARMS:
        points = [(r["evaluations"], r["search_ppl"]) for r in rows if r["arm"] == arm]
        if points:
            xs, ys = zip(*points, strict=True)
            axis.scatter(xs, ys, label=arm, s=30)
    axis.set_xlabel("candidates scored (each on every search window)")
    axis.set_ylabel("best search-split perplexity")
    axis.set_title("search.surrogate on training seeds (demo scale, 128 -> 1024)")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[100, 101, 102])
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--work", type=Path, default=ROOT / "runs/surrogate-tuning")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results")
    args = parser.parse_args()
    console = Console(width=160)
    rows = []
    started = time.perf_counter()
    for seed in args.seeds:
        for arm in args.arms:
            row = {"arm": arm, "seed": seed, **run_arm(arm, seed, args.work)}
            rows.append(row)
            console.print(
                f"{arm:28s} seed {seed}: search ppl {row['search_ppl']:.4f}, {row['evaluations']} candidates, "
                f"{row['generations']} generations"
            )
    summary = {}
    for arm in args.arms:
        mine = {r["seed"]: r for r in rows if r["arm"] == arm}
        ga = {r["seed"]: r for r in rows if r["arm"] == "official_ga"}
        summary[arm] = {
            "cost_ratio_to_ga": [mine[s]["evaluations"] / ga[s]["evaluations"] for s in args.seeds if s in ga],
            "search_ppl_ratio_to_ga": [mine[s]["search_ppl"] / ga[s]["search_ppl"] for s in args.seeds if s in ga],
        }
        console.print(
            f"{arm:28s} cost x{np.mean(summary[arm]['cost_ratio_to_ga']):.3f}, search ppl "
            + ", ".join(f"x{v:.4f}" for v in summary[arm]["search_ppl_ratio_to_ga"])
        )
    probes = {seed: probe(args.work / f"official_ga-seed{seed}") for seed in args.seeds if "official_ga" in args.arms}
    for seed, models in probes.items():
        for name, figures in models.items():
            console.print(f"probe seed {seed} {name:24s} {figures}")
    result = {
        **provenance(),
        "arms": {arm: ARMS[arm] for arm in args.arms},
        "rows": rows,
        "summary": summary,
        "probe": probes,
        "wall_s": time.perf_counter() - started,
    }
    save_json(args.out / "surrogate_tuning.json", result)
    plot(rows, args.out / "surrogate_tuning.png")


if __name__ == "__main__":
    main()
