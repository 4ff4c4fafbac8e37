"""A CPU gradient pass's peak resident memory with glibc's dynamic mmap threshold against the scorer's fixed 1 MiB
one (workers/host_memory.py), side by side, with the time each took.

    .venv/bin/python bench/host_memory.py --model DIR [--lengths 8192,16384]

DIR is a model directory (`longrope model get gemma3-270m DIR`: the model whose 64k descent the default threshold
ran out of the 24 GiB machine). Each (threshold, length) runs in a subprocess of its own, so its peak resident memory
(`ru_maxrss` of the child) is its own; "default" replaces the scorer's `return_freed_memory` by a no-op before the
Scorer is built. The pass is the scorer's own `score_with_gradient` on one window of random token ids with LongRoPE
factors of 2 past half the window, in float32 on all cores; both must give the same NLL and gradient, since only
where freed memory goes differs. Results: bench/results/host_memory.json, with the ratios per length.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import benchlib

THRESHOLDS = ("default", "1 MiB")


def child(model_dir: str, threshold: str, length: int) -> None:
    """One gradient pass, timed; prints a JSON line."""
    import torch

    from longrope.encodings import from_hf
    from longrope.workers import scorer
    from longrope.workers.models import load_model

    if threshold == "default":
        scorer.return_freed_memory = lambda: False
    model, rope = load_model(model_dir, device="cpu", dtype="float32")
    windows = torch.randint(0, 1000, (1, length + 1), generator=torch.Generator().manual_seed(0))
    pairs = rope.method.rotary_dim // 2
    block = {"rope_type": "longrope", "rope_theta": rope.method.rope_theta, "short_factor": [1.0] * pairs}
    block |= {"long_factor": [2.0] * pairs, "original_max_position_embeddings": length // 2}
    method = from_hf(block, head_dim=rope.method.head_dim, max_position_embeddings=length)
    start = time.perf_counter()
    score = scorer.Scorer(model, windows, rope.method.original_inv_freq()).score_with_gradient(method)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": seconds, "peak_bytes": peak, "nll": score.nll[0], "gradient": score.gradient[0]}))


def measure(model_dir: str, threshold: str, length: int) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", model_dir, threshold, str(length)], capture_output=True)
    if done.returncode != 0:
        tail = (done.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1][:200]
        return {"threshold": threshold, "length": length, "outcome": f"failed (exit {done.returncode}): {tail}"}
    return {"threshold": threshold, "length": length, "outcome": "ok", **json.loads(done.stdout.splitlines()[-1])}


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model directory (longrope model get gemma3-270m)")
    parser.add_argument("--lengths", default="8192,16384")
    args = parser.parse_args()
    rows = []
    for length in (int(value) for value in args.lengths.split(",")):
        pair = {threshold: measure(args.model, threshold, length) for threshold in THRESHOLDS}
        row = {"length": length}
        if all(result["outcome"] == "ok" for result in pair.values()):
            default, fixed = pair["default"], pair["1 MiB"]
            row["peak_gib"] = {name: result["peak_bytes"] / 2**30 for name, result in pair.items()}
            row["seconds"] = {name: result["seconds"] for name, result in pair.items()}
            row["memory_ratio"] = fixed["peak_bytes"] / default["peak_bytes"]
            row["time_ratio"] = fixed["seconds"] / default["seconds"]
            row["same_result"] = default["nll"] == fixed["nll"] and default["gradient"] == fixed["gradient"]
        else:
            row["outcomes"] = {name: result["outcome"] for name, result in pair.items()}
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"model": args.model, "rows": rows, **benchlib.provenance()}
    print(f"wrote {benchlib.save_json(benchlib.RESULTS / 'host_memory.json', result)}")


if __name__ == "__main__":
    main()
