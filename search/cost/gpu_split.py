"""A worker whose model is spread over its GPUs (`workers.num_gpus_per_worker: N`, N >= 2): what each GPU holds and
what the split costs in device time.

The layers are split by accelerate's device map with the LongRoPE release's 0.8 rule (workers/device_plan.py, the
same `DevicePlan` the worker loads with). Each GPU holds about a 1/N share of the weights and of the gradient pass's
checkpoints (each layer's input stays on its layer's GPU), while the activations of the layer being computed, or the
loss's chunk on the last GPU, are on one GPU at a time: the busiest GPU holds one layer's (or the loss's) whole
peak. The split is a pipeline without micro-batches: one GPU of the N computes at a time, so a candidate's device
time is N times its time on one GPU, while its wall time is the same.
"""

from __future__ import annotations

from longrope.search.cost.memory import Memory
from longrope.workers.device_plan import DevicePlan, plan_devices, spans_gpus


def split_gpus(num_gpus_per_worker: float, kind: str) -> int:
    """GPUs a worker's model is spread over: N for N >= 2 GPUs on a GPU device, else 1 (one device holds it)."""
    return int(num_gpus_per_worker) if kind == "gpu" and spans_gpus(num_gpus_per_worker) else 1


def worker_plan(memory: Memory, layers: int, gpus: int, capacity_gib: float | None) -> DevicePlan | None:
    """The worker's device plan for its weights (None on one device, or where the GPU's memory is unknown)."""
    if gpus < 2 or capacity_gib is None:
        return None
    return plan_devices(memory.weights, layers, gpus, capacity_gib * 2**30)


def busiest_gpu_peak(memory: Memory, gpus: int) -> float:
    """Bytes the busiest GPU holds at the peak, before headroom: its 1/N of the weights and of the checkpoints, and
    the larger of one layer's forward (plus its backward) and the loss, which one GPU holds whole. With one GPU this
    is `memory.peak`."""
    active = max(memory.forward_peak + memory.layer_backward, memory.loss_chunk)
    return (memory.weights + memory.checkpoints) / gpus + active


def pipeline_text(gpus: int) -> str:
    """What the split costs, said where the time is printed."""
    return (
        f"layers split over {gpus} GPUs, one computing at a time: a candidate's device time is {gpus} x its time "
        "above (the hours count it so), its wall time is that time"
    )
