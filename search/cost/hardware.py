"""The devices a job is priced on: GPUs by their datasheet peak and memory bandwidth at an assumed MFU, or
this machine's CPU by its measured rates (`cpu_rates.py`); both as `Rates`."""

from __future__ import annotations

from longrope.search.config.strict import JobConfigError
from longrope.search.cost.architecture import Frozen
from longrope.search.cost.flops import Flops


class Gpu(Frozen):
    name: str
    bf16_tflops: float  # peak dense (no 2:4 sparsity) bf16 tensor-core rate, from the vendor's datasheet
    memory_gib: float


GPUS = {
    gpu.name.lower(): gpu
    for gpu in (
        Gpu(name="A100", bf16_tflops=312, memory_gib=80),  # A100 datasheet (SXM and PCIe; 40 GB parts exist)
        Gpu(name="H100-SXM", bf16_tflops=989, memory_gib=80),  # H100 datasheet: 1979 with sparsity
        Gpu(name="H100-PCIe", bf16_tflops=756, memory_gib=80),
        Gpu(name="H200", bf16_tflops=989, memory_gib=141),  # H100's compute, more HBM
        Gpu(name="B200", bf16_tflops=2250, memory_gib=180),
        Gpu(name="L40S", bf16_tflops=362, memory_gib=48),  # L40S datasheet: 733 with sparsity
        Gpu(name="A10", bf16_tflops=125, memory_gib=24),  # A10 datasheet; AWS's A10G is this chip at lower clocks
        Gpu(name="L4", bf16_tflops=121, memory_gib=24),
    )
}
GPU_ALIASES = {"h100": "h100-sxm", "a10g": "a10"}
# Above this share of a candidate's time in forwards' fixed cost, no time is given (`withheld_time`). Measured by
# bench/estimate_accuracy.py (reference model, one window a forward): estimated / real was 0.82-0.83 at 11-19% of
# fixed cost in one run and 0.60-0.66 at 11-19% in another (the machine's per-op cost moves; what tiny ops cost
# beyond dispatch is not modelled), while the demo (1%) and a d 1024 model (0%) stayed at 0.90-1.21 in both: a
# tenth keeps every printed time within the target's 25%.
FIXED_COST_SHARE_LIMIT = 0.10
# Model FLOPs utilisation assumed when none is given: an assumption, not a measurement (no GPU on the machine
# that wrote this). Long-context prefill is matmul- and flash-attention-bound; FlashAttention-2 (Dao 2023)
# reports its forward at 50-73% of an A100's peak and dense bf16 GEMMs reach 60-80%, less the memory-bound
# norms, RoPE and the loss: 0.4 is a deliberately round, cautious middle. Measure yours and pass --mfu.
DEFAULT_MFU = 0.4


# What a GPU forward costs whatever its size, in eager PyTorch: every op is launched from Python, about 10 us of
# dispatch and launch each (PyTorch's own profiler shows 5-20 us of CPU time per eager op; CUDA documents a kernel
# launch at a few us), and a Llama-family decoder layer runs about 40 ops (two norms of ~5, four projections,
# the rotary's ~10, attention, the MLP's 5, two residual adds), plus ~20 outside the layers. An assumption, not a
# measurement: bench/gpu_check.py times a 16-token forward, which is all overhead, where a GPU is at hand. Used only
# to withhold GPU times that such overhead would dominate (the demo's 0.9M-parameter model: 58 us of FLOPs a
# candidate against ~1.8 ms a forward); on the shipped 7-8B configs it is under 1% and left out of the time.
GPU_OP_OVERHEAD_S = 10e-6
OPS_PER_LAYER, OPS_OUTSIDE_LAYERS = 40, 20


def gpu_forward_overhead(num_layers: int) -> float:
    """Seconds of launch-bound overhead in one eager GPU forward of a model with `num_layers` decoder layers."""
    return (OPS_PER_LAYER * num_layers + OPS_OUTSIDE_LAYERS) * GPU_OP_OVERHEAD_S


def find_gpu(name: str) -> Gpu:
    key = name.lower()
    gpu = GPUS.get(GPU_ALIASES.get(key, key))
    if gpu is None:
        known = ", ".join([*(gpu.name for gpu in GPUS.values()), "cpu"])
        raise JobConfigError(f"--gpu {name!r}: unknown GPU (known: {known})")
    return gpu


class Rates(Frozen):
    """Sustained rates a device runs each kind of work at (FLOP/s, bytes/s for the memory-bound ops)."""

    source: str
    linear: float
    attention: float
    lm_head: float
    memory: float | None = None  # None: the elementwise traffic is folded into the MFU (GPUs)
    square_matmul: float | None = None  # CPU: a 2048 x 2048 float32 matmul's rate, the efficiencies' yardstick
    forward_fixed_cost: float | None = None  # CPU: seconds every forward costs whatever its size (cpu_rates.py)
    local_attention: float | None = None  # CPU: windowed layers' blockwise attention; None: at `attention`'s rate


def gpu_rates(gpu: Gpu, mfu: float) -> Rates:
    """One rate for every matmul: peak x MFU (MFU counts model FLOPs over peak, memory-bound time included)."""
    rate = gpu.bf16_tflops * 1e12 * mfu
    return Rates(source=f"{gpu.name} {gpu.bf16_tflops:g} TFLOP/s bf16 peak x MFU {mfu:g}", linear=rate,
                 attention=rate, lm_head=rate)  # fmt: skip


def seconds(flops: Flops, rates: Rates, traffic_bytes: float = 0.0, forwards: float = 0.0) -> float:
    """Each kind of work at its own rate, plus the elementwise traffic at the memory rate and `forwards` times the
    fixed cost of a forward (each when the rates give one)."""
    time = flops.linear / rates.linear + flops.attention / rates.attention + flops.lm_head / rates.lm_head
    time += flops.local_attention / (rates.local_attention or rates.attention)
    time += traffic_bytes / rates.memory if rates.memory else 0.0
    return time + forwards * (rates.forward_fixed_cost or 0.0)
