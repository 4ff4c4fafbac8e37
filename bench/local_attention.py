"""A Gemma 3 forward at long lengths on this CPU with the local layers' window as a [T, T] mask (transformers' SDPA)
against the scorer's `blockwise` attention (workers/local_attention.py), side by side, time and peak memory.

    .venv/bin/python bench/local_attention.py --model DIR [--lengths 16384,32768,65536] [--limit 1800]

DIR is `longrope model get gemma3-270m DIR`'s directory. Each (attention, length) runs in a subprocess of its own,
so its peak resident memory (`ru_maxrss` of the child) is its own, and one that runs out of memory or past `--limit`
seconds is recorded as such rather than ending the benchmark. The forward is the decoder's (`model.model`, no
cache), as the scorer runs it, in float32 under inference mode, on one window of random token ids. The lm_head and
loss are the same for both and left out. Results: bench/results/local_attention.json, with the ratio per length.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import benchlib

ATTENTIONS = ("sdpa", "blockwise")


def child(model_dir: str, attention: str, length: int) -> None:
    """One forward, timed; prints a JSON line. The model loads with `attention` as transformers' implementation."""
    import torch
    from transformers import AutoModelForCausalLM

    from longrope.workers.local_attention import register

    register()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=attention).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        start = time.perf_counter()
        hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
        seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": seconds, "peak_bytes": peak, "checksum": float(hidden[0, -64:].double().sum())}))


def measure(model_dir: str, attention: str, length: int, limit: float) -> dict:
    command = [sys.executable, __file__, "--child", model_dir, attention, str(length)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return {"attention": attention, "length": length, "outcome": f"not finished in {limit:g} s"}
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return {"attention": attention, "length": length, "outcome": f"failed (exit {done.returncode}): {tail}"}
    return {"attention": attention, "length": length, "outcome": "ok", **json.loads(done.stdout.splitlines()[-1])}


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Gemma 3 model directory (longrope model get gemma3-270m)")
    parser.add_argument("--lengths", default="16384,32768,65536")
    parser.add_argument("--limit", type=float, default=1800.0, help="seconds one forward may take")
    args = parser.parse_args()
    rows = []
    for length in (int(value) for value in args.lengths.split(",")):
        pair = {attention: measure(args.model, attention, length, args.limit) for attention in ATTENTIONS}
        row = {"length": length, **pair}
        if all(result["outcome"] == "ok" for result in pair.values()):
            sdpa, blockwise = pair["sdpa"], pair["blockwise"]
            row["time_ratio"] = sdpa["seconds"] / blockwise["seconds"]
            row["memory_ratio"] = sdpa["peak_bytes"] / blockwise["peak_bytes"]
            row["same_hidden"] = abs(sdpa["checksum"] - blockwise["checksum"]) <= 1e-3 * abs(sdpa["checksum"])
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"model": args.model, "rows": rows, **benchlib.provenance()}
    print(f"wrote {benchlib.save_json(benchlib.RESULTS / 'local_attention.json', result)}")


if __name__ == "__main__":
    main()
