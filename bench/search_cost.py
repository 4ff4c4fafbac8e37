"""Search cost: the official GA against its surrogate-screened form, gradient descent and the hybrid, in one run.

0. backward cost c, measured first on this CPU: the project's Scorer on the reference model, at each length used,
   one torch thread (what each demo worker gets), alternating rounds of `Scorer.score` (the demo's 4 candidates per
   forward, as the GA's workers score) and `Scorer.score_with_gradient` (one candidate on a worker's share of a
   descent step's gradient windows, as the coordinator sends it). A window with a backward pass costs 1 + c
   window-equivalents (1 = one window's forward): c = (gradient seconds per window) / (forward seconds per window) - 1,
   the median of the rounds' ratios. Every cost below counts forward windows + c x backward windows.
1. model: the shipped reference model at the demo's scale (configs/demo.yaml: 128 -> 1024 tokens, population 32,
   20 generations, 8 search windows, 2 CPU workers), per seed, each variant run as `longrope search` runs it, with its
   shipped settings (nothing tuned per seed):
     official_ga    search.optimizer dim_mono, generational, no racing (the release's search: the reference)
     surrogate      the GA with search.surrogate on, shipped defaults (half the children scored, each
                    picked by a ridge surrogate from 8 x as many bred)
     gradient       search.optimizer gradient (search.gradient.*: 60 steps, lr 0.15, 2 held-out windows, patience 10)
     hybrid         search.optimizer hybrid (the GA untouched, then its final best polished by 10 line-search steps
                    from alpha 0.05, each kept only where it lowers the search NLL)
   and, with --variants, hybrid_adam (the polish by Adam's steps), hybrid_every_5 (polishing every 5
   generations too, each result adopted as a child) and the earlier ones (racing, racing_steady, cmaes; their
   results are in
   bench/results/search_cost_ga_variants.json). The variants run in a rotated order per seed, so the machine's load
   drifts over all of them alike. Per run: window-equivalents until the GA's final search NLL of the same seed
   (or "not reached"); the test perplexity (24 windows at 1024) of the run's best, and of the best it had found
   within 0.5x and within 1x the GA's whole window-equivalents, each with a paired 95% interval against the GA's
   best; wall time. Targets per seed: A, test perplexity within 1% of the GA's at <= 0.5x its
   window-equivalents; B, <= 0.97x the GA's at equal cost. Writes search_cost.json and search_cost.png.
2. 16x: the reference model (trained at 128 tokens) read at 2048 (`target_length=2048`, nothing else changed: the
   search split has 32 documents of at least 2049 bytes for the 8 search windows, the test split 112 for the 24 test
   windows). Every closed form at its nominal setting (none, pi, ntk, dynamic, yarn, llama3); NTK tuned on the search
   split over compare's grid (`ntk_tuned`: scale x 0.5..4, attention 1.0..1.3 and LongRoPE's) and over a wider grid
   (`ntk_tuned_wide`: scale x 0.5..16, attention factor 1.0..1.6, the GA's own range); YaRN with its factor and
   attention factor (temperature) tuned the same way (`yarn_tuned`, wide grid); then the GA's, gradient's and
   hybrid's bests per seed. Test perplexity at 2048 (24 windows), paired interval and ratio to the best baseline
   (tuned included); target: <= 0.6x. Writes STEM_16x.json and STEM_16x.png.
3. cluster (only with --parts cluster): 8 Ray workers with fake GPUs score the tests' known problem on 8 windows
   (bench/known_problem.py: no model) with a latency of 20 ms per window, jittered uniformly by +-30%;
   worker utilisation = busy time / (workers x wall), generational vs steady (each with and without racing), at
   the demo's search sizes; then gradient descent (20 steps, 2 held-out windows, on 8 and on 4 search windows,
   250 ms a window, a backward window 3x, jittered by 0 and by +-30%) beside the utilisation `longrope estimate`
   computes for it (search/cost/utilisation.py), and the pool's own busy clock (what `longrope status` prints).

Run: .venv/bin/python bench/search_cost.py --seeds 0 1 2 3 4 [--seeds-16x 0 1 2] [--parts model 16x]
     [--variants official_ga gradient hybrid] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from benchlib import provenance
from rich.console import Console
from search_cost_parts.backward_cost_c import backward_cost
from search_cost_parts.cluster_part import cluster_benchmark, print_cluster_table
from search_cost_parts.model_part import model_benchmark, print_model_table
from search_cost_parts.plots import replot
from search_cost_parts.variants import DEFAULT_VARIANTS, LENGTH_16X, REFERENCE, ROOT, VARIANTS, WIDTH
from search_cost_parts.x16_part import benchmark_16x, print_16x_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--seeds-16x", type=int, nargs="*", default=[0, 1, 2, 3, 4])
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(DEFAULT_VARIANTS))
    parser.add_argument("--parts", nargs="+", choices=["model", "16x", "cluster"], default=["model", "16x"])
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds that measure c")
    outputs = "STEM.json, .png; STEM_16x.json, .png; STEM_cluster.json"
    parser.add_argument("--stem", default="search_cost", help=f"the outputs: {outputs}")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results")
    parser.add_argument("--replot", action="store_true", help="redraw the plots from the saved JSON, run nothing")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override every search")
    args = parser.parse_args()
    if REFERENCE not in args.variants:
        parser.error(f"--variants: {REFERENCE} is the reference every cost and interval is measured against")
    if args.replot:
        replot(args.out, args.stem)
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    args.out.mkdir(parents=True, exist_ok=True)
    console = Console(width=WIDTH)
    meta = provenance()
    costs = {}
    with tempfile.TemporaryDirectory() as work:
        lengths = [1024] * ("model" in args.parts) + [LENGTH_16X] * ("16x" in args.parts)
        for length in lengths:
            costs[length] = backward_cost(length, args.rounds, Path(work) / f"cost-{length}")
            cost = costs[length]
            console.print(
                f"c at {length}: {cost['c']:.3f} "
                f"(vs a one-candidate forward: {cost['c_vs_single_candidate_forward']:.3f}); "
                f"s/window forward {cost['seconds_per_window']['forward_batched']:.4f}, "
                f"forward+backward {cost['seconds_per_window']['gradient']:.4f}"
            )
    if "cluster" in args.parts:
        result = {**meta, "cluster": cluster_benchmark(args.seeds)}
        print_cluster_table(result["cluster"])
        (args.out / f"{args.stem}_cluster.json").write_text(json.dumps(result, indent=1, default=str))
    if "model" in args.parts:
        started = time.perf_counter()
        model = model_benchmark(args.variants, args.seeds, costs[1024]["c"], args.out, args.stem, args.set)
        result = {
            **meta,
            "machine": dict(meta["machine"]),
            "backward_cost": costs[1024],
            "model": model,
            "bench_wall_s": time.perf_counter() - started,
        }
        result["machine"]["load_average_at_end"] = os.getloadavg()
        print_model_table(model, "1. reference model, demo scale (128 -> 1024)")
        (args.out / f"{args.stem}.json").write_text(json.dumps(result, indent=1, default=str))
    if "16x" in args.parts:
        started = time.perf_counter()
        png = args.out / f"{args.stem}_16x.png"
        big = benchmark_16x(args.variants, args.seeds_16x, costs[LENGTH_16X]["c"], png, args.set)
        result = {
            **meta,
            "machine": dict(meta["machine"]),
            "backward_cost": costs[LENGTH_16X],
            "x16": big,
            "bench_wall_s": time.perf_counter() - started,
        }
        result["machine"]["load_average_at_end"] = os.getloadavg()
        print_16x_table(big)
        (args.out / f"{args.stem}_16x.json").write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
