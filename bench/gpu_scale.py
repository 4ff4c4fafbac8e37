"""Llama-3-8B at 128k, 512k and 1M tokens on one GPU, measured beside what `longrope estimate` prices, in one run.

The claim this checks is the estimate's: a Llama-3-8B forward through the project's Scorer at 1M tokens fits one
80 GiB GPU (about 61 GiB of tensors: 15 GiB of weights, the rest one layer's activations, the MLP in chunks and the
loss in chunks), and a gradient pass at 128k fits with its layer checkpoints on the host (about 38 GiB). A model of
Llama-3-8B's shape (32 layers, d_model 4096, 32 heads x 128, 8 key/value heads, MLP 14336, 128k vocabulary,
rope_theta 500000, pre-trained at 8192) with random bfloat16 weights is built straight on the GPU (no download, no
float32 copy, no host round trip) and scored with SDPA. Memory depends on the shapes alone, so random weights are
enough. The parts, most valuable first, each written to the JSON as it finishes (a run stopped at its limit keeps
what it measured):
1. `build`: the model's seconds and its weights as allocated, against the estimate's;
2. `forward` at the shortest length (128k, all 32 layers): seconds, achieved TFLOP/s (search/cost/flops.py
   `forward_flops`, SDPA's causal half), torch's peak allocated memory against the estimate's peak
   (search/cost/memory.py `worker_memory`, and with the estimate's GPU headroom beside the reserved peak);
   its rate then predicts every later part's time;
3. `gradient` (`Scorer.score_with_gradient`, layers checkpointed where `checkpoints: auto` puts them) at 128k, or at
   64k when 128k runs out of memory: seconds and peak against `gradient_memory` (`offloaded` as the scorer offloads);
4. `forward` at the other lengths, longest first (1M, then 512k);
5. `split`: a smaller model (4 layers at Llama-3-8B width, float32, 4k tokens) split in two halves by accelerate's
   `dispatch_model` hooks (the first GPU and a second where there is one, else the same GPU twice: the hooks,
   moved inputs, targets, logits and rope tables still run), scored and differentiated against the unsplit model.
A length that runs out of memory is recorded as {"error": "out of memory", ...} and the run goes on with the cache
emptied; any other runtime error is recorded the same way.

Why fewer layers at the longest lengths: attention is 95% of a forward's FLOPs at 1M tokens, 9.4 PFLOP a layer, so
all 32 layers would take about 13 minutes at the estimate's 0.4 MFU of an H100 (396 TFLOP/s), more than the 10
minutes a run may take. At 1M only the first 4 layers run (16 of 32 at 512k; `--layers-run`), with all 32 resident:
with use_cache=False a forward's peak is the weights plus one layer's activations, whatever the number of layers
run, so the peak measured is the 32-layer model's and is set against the 32-layer estimate. Each row says how many
layers ran and gives the seconds all 32 would take at the rate measured (`seconds_all_layers_at_this_rate`).

Budget: `--budget-s` (540) from the start of `main` (after the imports); a part whose predicted seconds (its FLOPs
at the rate measured at the shortest length, the estimate's assumption before that: `--assumed-tflops`) exceed
what is left is skipped with the reason recorded. At 396 TFLOP/s: 128k 16 s (6.5 PFLOP), the gradient 65 s
(4x a forward), 1M x 4 layers 98 s (39 PFLOP; all 32 would be 768 s), 512k x 16 layers 102 s, the split a few seconds,
the build and the first kernels some more: about 300 s, the rest a margin for a slower rate.

The GPU machine has torch (CUDA), transformers and accelerate but not pydantic, and reaches no registry: the package
is imported from this checkout (bench/checkout_package.py) and pydantic travels as wheels. Here, once:
  bash bench/gpu_wheels.sh                       # .whl/
Then one device run, carry [".whl"], timeout_s 600:
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  && export PYTHONPATH=/tmp/site && PYTHONUNBUFFERED=1 python3 bench/gpu_scale.py
which writes $OUT/gpu_scale.json (`--out`; without $OUT, bench/results/gpu_scale.json).

`--dry-run`: the same code on tiny shapes (d_model 64, vocabulary 256, 2 layers, 64 / 128 / 256 tokens, 1 layer run
at 256) on the CPU, so the script cannot rot (tests/test_gpu_scale.py; bench/results/gpu_scale_dry_run.json).
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from checkout_package import importable_package  # bench/ is on the path: the script's folder

importable_package()

import torch  # noqa: E402 (after the package is made importable)
from benchlib import installed_version, provenance, save_json  # noqa: E402
from gpu_check import DRY as CHECK_DRY  # noqa: E402
from gpu_check import FULL as CHECK_FULL  # noqa: E402
from gpu_check import Device, candidates_for, one_window_scorer  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from longrope.search.cost.architecture import Architecture  # noqa: E402
from longrope.search.cost.budget import BACKWARD_PER_FORWARD  # noqa: E402
from longrope.search.cost.flops import forward_flops, recompute_flops  # noqa: E402
from longrope.search.cost.hardware import DEFAULT_MFU, GPUS  # noqa: E402
from longrope.search.cost.memory import (  # noqa: E402
    ForwardShape,
    gpu_headroom,
    gradient_memory,
    offloaded,
    worker_memory,
)
from longrope.workers.families import decoder_of  # noqa: E402
from longrope.workers.random_llama import llama_config  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GIB = 2**30
FULL = {
    "shape": CHECK_FULL["shape"], "layers": 32, "lengths": (131072, 524288, 1048576),
    "layers_run": {524288: 16, 1048576: 4}, "gradient_lengths": (131072, 65536), "warm_up": 4096,
    "split_layers": 4, "split_tokens": 4096,
}  # fmt: skip
DRY = {
    "shape": CHECK_DRY["shape"], "layers": 2, "lengths": (64, 128, 256), "layers_run": {256: 1},
    "gradient_lengths": (128, 64), "warm_up": 16, "split_layers": 4, "split_tokens": 128,
}  # fmt: skip
# The estimate's own assumption for an H100 (search/cost/hardware.py), used until the first forward is measured
ASSUMED_TFLOPS = DEFAULT_MFU * GPUS["h100-sxm"].bf16_tflops
SPLIT_TOLERANCE = 1e-5  # nats per token: float32, the same kernels on both sides
# float32 matmuls run without tensor cores (TF32 is off in torch by default): an H100's float32 peak is 67 TFLOP/s
# against bfloat16's 989, so a float32 part is predicted at a tenth of the measured bfloat16 rate
FLOAT32_SLOWDOWN = 10.0


class Budget:
    """Seconds left of the run, and the rate that predicts a part's seconds from its FLOPs."""

    def __init__(self, seconds: float, tflops: float):
        self.seconds, self.started = seconds, time.monotonic()
        self.rate, self.measured = tflops * 1e12, False

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.started)

    def refusal(self, flops: float) -> str | None:
        """Why a part of `flops` is skipped (its predicted seconds exceed those left), or None."""
        predicted, left = flops / self.rate, self.left()
        if predicted <= left:
            return None
        source = "measured" if self.measured else "assumed"
        return f"predicted {predicted:.0f} s at the {source} {self.rate / 1e12:.0f} TFLOP/s, {left:.0f} s left"

    def learn(self, flops: float, seconds: float) -> None:
        if not self.measured:
            self.rate, self.measured = flops / seconds, True


def build(config, device: Device, dtype: torch.dtype):
    """The random-weight Llama (seed 0) initialised where it lives, at `dtype` from the start: an 8B's weights are
    15 GiB in bfloat16 and would be 30 GiB more as a float32 copy."""
    torch.manual_seed(0)
    with torch.device(device.name):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def sdpa_llama(shape: dict, layers: int):
    return llama_config(num_hidden_layers=layers, attn_implementation="sdpa", **shape)


@contextmanager
def first_layers(model, count: int) -> Iterator[None]:
    """Only the decoder's first `count` layers run for the block, every layer still resident (so the memory held is
    the whole model's); the layer list is given back after."""
    decoder = decoder_of(model)
    every = decoder.layers
    decoder.layers = torch.nn.ModuleList(list(every)[:count])
    try:
        yield
    finally:
        decoder.layers = every


def estimate(arch: Architecture, tokens: int, device: Device, gradient: bool = False) -> dict:
    """The estimate's peak for one window of `tokens` (tensors, as max_memory_allocated counts them) and with its
    GPU headroom (the CUDA context, the rope tables, the allocator's slack); a gradient pass's checkpoints where the
    scorer's `auto` keeps them on this GPU (none offloaded on the CPU)."""
    shape = ForwardShape(tokens=tokens, rows=1)
    memory = (gradient_memory if gradient else worker_memory)(arch, shape, "bfloat16", "sdpa")
    if gradient and device.cuda:
        memory = offloaded(memory, torch.cuda.get_device_properties(0).total_memory)
    return {
        "estimate_peak_gib": memory.peak / GIB,
        "estimate_with_headroom_gib": (memory.peak + gpu_headroom(memory, shape, arch)) / GIB,
        **({"estimate_checkpoints_on_host": memory.host_checkpoints > 0} if gradient else {}),
    }


def gradient_flops(arch: Architecture, tokens: int) -> float:
    """A gradient pass: the forward, the checkpointed recompute and the backward at the estimate's ratios
    (search/cost/budget.py BACKWARD_PER_FORWARD; it also leaves out the first layer's q, k, v backward, a rounding
    here)."""
    forward = forward_flops(arch, tokens)
    backward = (
        forward.linear * BACKWARD_PER_FORWARD["linear"]
        + forward.attention * BACKWARD_PER_FORWARD["attention_flash"]
        + forward.local_attention * BACKWARD_PER_FORWARD["attention_eager"]
        + forward.lm_head * BACKWARD_PER_FORWARD["lm_head"]
    )
    return forward.total + recompute_flops(arch, forward, tokens).total + backward


def timed(device: Device, fn: Callable):
    """(seconds, result) of one call of `fn`: at these lengths one call is all the budget holds."""
    results = []
    seconds = device.seconds(lambda: results.append(fn()), repeats=1, warm_ups=0)
    return seconds, results[0]


def measured_memory(device: Device, estimated: dict) -> dict:
    if not device.cuda:
        return {"peak_memory_gib": None, "peak_reserved_gib": None, "memory_ratio": None}
    peak = device.peak_gib()
    reserved = torch.cuda.max_memory_reserved() / GIB
    ratio = peak / estimated["estimate_peak_gib"]
    return {"peak_memory_gib": peak, "peak_reserved_gib": reserved, "memory_ratio": ratio}


def attempt(device: Device, run: Callable[[], dict]) -> dict:
    """`run()`'s row, or the error it raised as a row (out of memory, or another runtime error such as a CUDA
    kernel's), with the cache emptied after so the next part starts from the weights alone."""
    try:
        return run()
    except torch.OutOfMemoryError as exc:
        failure = {"error": "out of memory", "message": str(exc).splitlines()[0] if str(exc) else ""}
    except RuntimeError as exc:
        failure = {"error": type(exc).__name__, "message": str(exc).splitlines()[0] if str(exc) else ""}
    failure["peak_memory_gib"] = device.peak_gib()  # how far it got
    gc.collect()  # the exception's frames, and the activations they held, are gone only now
    device.reset_peak()
    return failure


def forward_row(model, config, arch, length: int, layers_run: int, device: Device, budget: Budget) -> dict:
    run_arch = arch.model_copy(update={"num_layers": layers_run})
    flops, all_flops = forward_flops(run_arch, length).total, forward_flops(arch, length).total
    row = {"tokens": length, "layers_resident": arch.num_layers, "layers_run": layers_run, "flops": flops}
    row |= estimate(arch, length, device)
    why = budget.refusal(flops)
    if why:
        print(f"forward {length}: skipped, {why}", flush=True)
        return {**row, "skipped": why}

    def run() -> dict:
        scorer = one_window_scorer(model, config, length)
        candidate = candidates_for(config, length, 1)
        device.reset_peak()
        with first_layers(model, layers_run):
            seconds, (score,) = timed(device, lambda: scorer.score(candidate))
        budget.learn(flops, seconds)
        return {
            "seconds": seconds, "tflops": flops / seconds / 1e12, "mean_nll": score.mean_nll,
            "seconds_all_layers_at_this_rate": seconds * all_flops / flops, **measured_memory(device, row),
        }  # fmt: skip

    row |= attempt(device, run)
    print(f"forward {length} ({layers_run} of {arch.num_layers} layers): {brief(row)}", flush=True)
    return row


def gradient_rows(model, config, arch, lengths, device: Device, budget: Budget) -> list[dict]:
    """The first length that fits: each length after one that ran out of memory (or was skipped) is tried next."""
    rows = []
    for length in lengths:
        flops = gradient_flops(arch, length)
        row = {"tokens": length, "layers": arch.num_layers, "flops": flops, **estimate(arch, length, device, True)}
        why = budget.refusal(flops)
        if why:
            rows.append({**row, "skipped": why})
            print(f"gradient {length}: skipped, {why}", flush=True)
            continue

        def run(length=length, flops=flops, row=row) -> dict:
            scorer = one_window_scorer(model, config, length)
            (candidate,) = candidates_for(config, length, 1)
            home = scorer.checkpoint_home(1)
            device.reset_peak()
            seconds, score = timed(device, lambda: scorer.score_with_gradient(candidate))
            return {
                "seconds": seconds, "tflops": flops / seconds / 1e12, "mean_nll": score.mean_nll,
                "checkpoints": "host" if home is not None else "device", **measured_memory(device, row),
            }  # fmt: skip

        row |= attempt(device, run)
        rows.append(row)
        print(f"gradient {length}: {brief(row)}", flush=True)
        if "error" not in row:
            break
    return rows


def split_devices(device: Device) -> list:
    """Where the two halves go: two GPUs where there are, the one GPU twice, or the CPU twice in a dry run."""
    if not device.cuda:
        return ["cpu", "cpu"]
    return [0, 1] if torch.cuda.device_count() >= 2 else [0, 0]


def split_part(shape: dict, layers: int, length: int, device: Device, budget: Budget) -> dict:
    """Scores and a gradient of the unsplit model, then the same model with accelerate's hooks placing its halves
    (`dispatch_model`, as transformers' device_map does for a worker's GPUs: workers/models.py `spread_over_gpus`),
    on the same windows; float32, so any difference is the split's, not bfloat16's rounding."""
    from accelerate import dispatch_model
    from accelerate.hooks import remove_hook_from_submodules

    devices = split_devices(device)
    result = {"layers": layers, "tokens": length, "dtype": "float32", "devices": [str(d) for d in devices]}
    config = sdpa_llama(shape, layers)
    arch = Architecture.from_hf_config(config.to_dict())
    flops = 4 * forward_flops(arch, length).total + 2 * gradient_flops(arch, length)  # 2 candidates, 2 sides
    why = budget.refusal(flops * FLOAT32_SLOWDOWN)
    if why:
        print(f"split {length}: skipped, {why}", flush=True)
        return {**result, "skipped": why}
    model = build(config, device, torch.float32)

    def scores() -> tuple[list[float], list[float], float]:
        scorer = one_window_scorer(model, config, length, seed=2)
        candidates = candidates_for(config, length, 2)
        seconds, scored = timed(device, lambda: scorer.score(candidates))
        gradient = scorer.score_with_gradient(candidates[0]).gradient[0]
        return [score.mean_nll for score in scored], list(gradient), seconds

    def run() -> dict:
        plain_nll, plain_gradient, plain_seconds = scores()
        half = layers // 2
        device_map = {"model.embed_tokens": devices[0], "model.rotary_emb": devices[0]}
        device_map |= {f"model.layers.{i}": devices[0] if i < half else devices[1] for i in range(layers)}
        device_map |= {"model.norm": devices[1], "lm_head": devices[1]}
        dispatch_model(model, device_map, main_device=devices[0], force_hooks=True)
        try:
            split_nll, split_gradient, split_seconds = scores()
        finally:
            remove_hook_from_submodules(model)
        nll_difference = max(abs(a - b) for a, b in zip(plain_nll, split_nll, strict=True))
        gradient_difference = max(abs(a - b) for a, b in zip(plain_gradient, split_gradient, strict=True))
        return {
            "layers_per_half": [half, layers - half], "plain_mean_nll": plain_nll, "split_mean_nll": split_nll,
            "max_abs_nll_difference": nll_difference, "max_abs_gradient_difference": gradient_difference,
            "tolerance": SPLIT_TOLERANCE, "agrees": nll_difference <= SPLIT_TOLERANCE,
            "plain_seconds": plain_seconds, "split_seconds": split_seconds,
        }  # fmt: skip

    result |= attempt(device, run)
    print(f"split {length}: {brief(result)}", flush=True)
    return result


def brief(row: dict) -> str:
    if "error" in row or "skipped" in row:
        return row.get("error") or f"skipped, {row['skipped']}"
    if "agrees" in row:
        return f"NLL difference {row['max_abs_nll_difference']:.2e}, agrees {row['agrees']}"
    memory = "" if row["peak_memory_gib"] is None else f", peak {row['peak_memory_gib']:.3g} GiB"
    return f"{row['seconds']:.3g} s{memory} (estimate {row['estimate_peak_gib']:.3g} GiB)"


def parse_layers_run(text: str) -> dict[int, int]:
    """`524288=16,1048576=4` -> {524288: 16, 1048576: 4}."""
    pairs = (item.split("=") for item in text.split(",") if item)
    return {int(length): int(count) for length, count in pairs}


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (what CI runs)")
    parser.add_argument("--layers", type=int, help="decoder layers resident (32; dry run 2)")
    parser.add_argument("--lengths", help="forward lengths, comma-separated (131072,524288,1048576)")
    parser.add_argument("--gradient-lengths", help="gradient lengths tried in turn (131072,65536)")
    parser.add_argument("--layers-run", help="layers run at a length, LENGTH=K,... (524288=16,1048576=4)")
    parser.add_argument("--budget-s", type=float, default=540.0, help="seconds the run may take, from its start")
    parser.add_argument("--assumed-tflops", type=float, default=ASSUMED_TFLOPS, help="rate before one is measured")
    parser.add_argument("--split-tokens", type=int, help="the split's window (4096; dry run 128)")
    default_out = Path(os.environ["OUT"]) / "gpu_scale.json" if os.environ.get("OUT") else None
    parser.add_argument("--out", type=Path, default=default_out)
    args = parser.parse_args(argv)
    sizes = DRY if args.dry_run else FULL
    args.layers = args.layers or sizes["layers"]
    args.lengths = sorted(int(n) for n in args.lengths.split(",")) if args.lengths else list(sizes["lengths"])
    args.gradient_lengths = (
        [int(n) for n in args.gradient_lengths.split(",")] if args.gradient_lengths else sizes["gradient_lengths"]
    )
    args.layers_run = parse_layers_run(args.layers_run) if args.layers_run is not None else sizes["layers_run"]
    args.split_tokens = args.split_tokens or sizes["split_tokens"]
    args.sizes = sizes
    name = "gpu_scale_dry_run.json" if args.dry_run else "gpu_scale.json"
    args.out = args.out or ROOT / "bench" / "results" / name
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device: run it on the GPU machine, or --dry-run here")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = arguments(argv)
    budget = Budget(args.budget_s, args.assumed_tflops)
    device = Device("cpu" if args.dry_run else "cuda")
    sizes = args.sizes
    result = {
        **provenance(), "dry_run": args.dry_run, "shape": sizes["shape"], "layers": args.layers,
        "budget_s": args.budget_s, "assumed_tflops": args.assumed_tflops, "layers_run": args.layers_run,
        "transformers": installed_version("transformers"), "accelerate": installed_version("accelerate"),
    }  # fmt: skip
    if device.cuda:
        properties = torch.cuda.get_device_properties(0)
        result |= {"gpu": properties.name, "gpu_memory_gib": properties.total_memory / GIB, "cuda": torch.version.cuda}
    config = sdpa_llama(sizes["shape"], args.layers)
    arch = Architecture.from_hf_config(config.to_dict())
    started = time.perf_counter()
    model = build(config, device, torch.bfloat16)
    device.sync()
    result["build"] = {
        "seconds": time.perf_counter() - started,
        "weights_gib": torch.cuda.memory_allocated() / GIB if device.cuda else None,
        "estimate_weights_gib": worker_memory(arch, ForwardShape(tokens=1, rows=1), "bfloat16", "sdpa").weights / GIB,
    }
    save_json(args.out, result)
    # kernels and cuBLAS loaded before the first timed forward (any long-regime candidate reads a short window alike)
    warm_up = candidates_for(config, 2 * config.max_position_embeddings, 1)
    one_window_scorer(model, config, sizes["warm_up"]).score(warm_up)

    rows = {}
    shortest, *longer = args.lengths
    for length in [shortest, None, *reversed(longer)]:  # then longest first: the claim at 1M matters most
        if length is None:  # the gradient, once the shortest forward has measured the rate
            result["gradient"] = gradient_rows(model, config, arch, args.gradient_lengths, device, budget)
        else:
            layers_run = min(args.layers, args.layers_run.get(length, args.layers))
            rows[length] = forward_row(model, config, arch, length, layers_run, device, budget)
            result["forward"] = [rows[n] for n in sorted(rows)]
        save_json(args.out, result)
    del model
    gc.collect()
    device.reset_peak()
    result["split"] = split_part(sizes["shape"], sizes["split_layers"], args.split_tokens, device, budget)
    result["elapsed_s"] = args.budget_s - budget.left()
    save_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
