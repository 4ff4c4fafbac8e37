"""What a search will cost before it runs: parameters, FLOPs per candidate, candidates, memory per worker, hours.

Pure functions over two small pydantic models (the model's `Architecture`, read from a config.json without
weights, and the validated `JobConfig`); nothing here imports torch, ray or transformers, so `longrope estimate`
answers in well under a second on a laptop. The pieces: `architecture.py` (the model's shape), `flops.py` (FLOPs
per forward, with their sources), `budget.py` (candidates and window evaluations), `memory.py` (forwards and
memory per worker), `hardware.py` (GPU and CPU rates); the measured CPU rates that `--gpu cpu` uses live in
`cpu_rates.py` (it imports torch when called).

On a CPU a candidate's time also counts its forwards (`forwards_per_candidate`, as the scorer stacks candidates
and windows) times a forward's measured fixed cost; where that fixed cost is over FIXED_COST_SHARE_LIMIT of the
time, no time is given (`withheld_time`): the estimate is not valid for such small forwards.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import computed_field

from longrope.search.config.job_config import JobConfig
from longrope.search.config.strict import JobConfigError
from longrope.search.cost.architecture import Architecture, Frozen, parameter_count
from longrope.search.cost.budget import (
    BACKWARD_ELEMENTWISE_PER_FORWARD,
    backward_cost,
    backward_flops,
    gradient_steps,
    gradient_windows,
    raced_children,
    search_budget,
    stage_flops,
    window_evaluations,
)
from longrope.search.cost.flops import Flops, elementwise_bytes
from longrope.search.cost.gpu_split import busiest_gpu_peak, split_gpus, worker_plan
from longrope.search.cost.hardware import FIXED_COST_SHARE_LIMIT, Rates, gpu_forward_overhead, seconds
from longrope.search.cost.memory import (
    DTYPE_BYTES,
    Memory,
    forward_shape,
    forwards_per_candidate,
    gpu_headroom,
    gradient_memory,
    gradient_shape,
    offloaded,
    worker_dtype,
    worker_memory,
)
from longrope.search.cost.utilisation import Utilisation, utilisation
from longrope.workers.device_plan import DevicePlan


class StageEstimate(Frozen):
    length: int
    candidates: int
    windows: int
    flops_per_candidate: Flops
    elementwise_bytes_per_candidate: float  # in the model dtype of the first device
    backward_windows: int = 0  # gradient and hybrid: window passes with a backward, beyond the forwards above
    flops_per_backward_window: Flops | None = None  # what such a pass adds to its forward (`backward_flops`)
    elementwise_bytes_per_backward_window: float = 0.0

    @computed_field
    @property
    def total_flops(self) -> float:
        extra = self.flops_per_backward_window.total * self.backward_windows if self.backward_windows else 0.0
        return self.flops_per_candidate.total * self.candidates + extra


class DeviceEstimate(Frozen):
    device: str
    dtype: str
    rates: Rates
    rows_per_forward: int  # at the longest stage
    memory: Memory  # at the longest stage
    memory_capacity_gib: float | None
    forwards_per_candidate: float  # at the target
    # the largest share of a candidate's time that is forwards' fixed cost (CPU: measured, in the time; GPU: the
    # assumed launch overhead, `hardware.gpu_forward_overhead`, which only withholds)
    fixed_cost_share: float | None
    time_withheld: str | None  # why the times below are None (`withheld_time`)
    seconds_per_candidate: float | None  # at the target (last stage)
    hours: float | None  # device-hours of the whole job, every candidate on every window (upper bound)
    hours_racing: float | None  # with racing: the expected device-hours (docs/search-cost.md's racing share)
    devices_in_parallel: float | None  # GPUs the config's workers use at once
    utilisation: Utilisation | None = None  # their busy share (wall hours = hours / devices / this)
    gradient_memory: Memory | None = None  # gradient and hybrid: a gradient pass at the longest stage
    gradient_rows_per_forward: int | None = None
    seconds_per_backward_window: float | None = None  # at the target: a gradient pass beyond its forward
    headroom: float = 0.0  # a GPU: bytes beyond `memory.peak` (`memory.gpu_headroom`); a CPU: none counted
    gradient_headroom: float = 0.0  # the same beyond `gradient_memory.peak`
    # GPUs each worker's model is spread over (workers.num_gpus_per_worker >= 2; 1: one device holds it), and their
    # plan (`gpu_split.worker_plan`): the GPUs the weights need at 0.8 of each, max_memory, layers per GPU
    gpus_per_worker: int = 1
    device_plan: DevicePlan | None = None

    @computed_field
    @property
    def wall_hours(self) -> float | None:
        """Hours on the config's GPUs at once, their idle time included: hours / GPUs / utilisation."""
        if self.hours is None or not self.devices_in_parallel or self.utilisation is None:
            return None
        return self.hours / self.devices_in_parallel / self.utilisation.value

    @computed_field
    @property
    def memory_per_gpu(self) -> float | None:
        """Spread over GPUs: the busiest GPU's peak with headroom (`gpu_split.busiest_gpu_peak`); None on one."""
        if self.gpus_per_worker < 2:
            return None
        peaks = [busiest_gpu_peak(self.memory, self.gpus_per_worker) + self.headroom]
        if self.gradient_memory:
            peaks.append(busiest_gpu_peak(self.gradient_memory, self.gpus_per_worker) + self.gradient_headroom)
        return max(peaks)

    @computed_field
    @property
    def fits(self) -> bool | None:
        """Both peaks with their headroom within the device's memory; spread over GPUs, the busiest GPU's share
        within one GPU and the weights within the GPUs at the plan's share of each."""
        if self.memory_capacity_gib is None:
            return None
        if self.memory_per_gpu is not None:
            planned = self.device_plan is None or self.device_plan.fits
            return planned and self.memory_per_gpu <= self.memory_capacity_gib * 2**30
        peaks = [self.memory.peak + self.headroom]
        if self.gradient_memory:
            peaks.append(self.gradient_memory.peak + self.gradient_headroom)
        return max(peaks) <= self.memory_capacity_gib * 2**30


class JobEstimate(Frozen):
    model: str
    model_source: str
    parameters: int
    original_length: int
    stages: tuple[StageEstimate, ...]
    candidates: int
    window_evaluations: float
    window_evaluations_racing: float | None
    racing_child_fraction: tuple[float, float, float] | None
    devices: tuple[DeviceEstimate, ...]
    gradient_steps: int = 0  # per search (stage): steps with a backward (`gradient_steps`)
    gradient_windows: int = 0  # windows each such step differentiates (`gradient_windows`)
    backward_window_passes: int = 0  # the whole job: window passes with a backward


def resolve_original_length(config: JobConfig, arch: Architecture) -> int:
    original = config.original_length or arch.original_length
    if original is None:
        raise JobConfigError(
            "original_length: not in the job config and the model config has no max_position_embeddings"
        )
    if config.target_length <= original:
        raise JobConfigError(
            f"target_length: must be greater than original_length ({original}), got {config.target_length}"
        )
    return original


def stage_estimates(config: JobConfig, arch: Architecture, original: int, dtype: str) -> tuple[StageEstimate, ...]:
    budget = search_budget(config, original)
    return tuple(
        StageEstimate(
            length=stage.length,
            candidates=stage.candidates,
            windows=stage.windows,
            flops_per_candidate=stage_flops(config, arch, stage, original),
            elementwise_bytes_per_candidate=elementwise_bytes(arch, stage.length, DTYPE_BYTES[dtype]) * stage.windows,
            backward_windows=stage.backward_windows,
            flops_per_backward_window=backward_flops(config, arch, stage, original) if stage.backward_windows else None,
            elementwise_bytes_per_backward_window=elementwise_bytes(arch, stage.length, DTYPE_BYTES[dtype])
            * (1 + BACKWARD_ELEMENTWISE_PER_FORWARD)
            * bool(stage.backward_windows),
        )
        for stage in budget.stages
    )


def backward_window_seconds(
    config: JobConfig, stage: StageEstimate, rates: Rates, device: Literal["cpu", "gpu"]
) -> float:
    """Time a gradient pass adds to its window's forward: its FLOPs and elementwise traffic at the device's rates,
    and on a CPU two forwards' fixed cost per gradient forward (the checkpointed recompute is a forward; the
    backward walks as many autograd nodes as the forward ran ops), shared by the windows stacked in it."""
    if not stage.backward_windows:
        return 0.0
    rows = gradient_shape(config, stage.length, device).rows
    return seconds(stage.flops_per_backward_window, rates, stage.elementwise_bytes_per_backward_window, 2 / rows)


def device_estimate(
    config: JobConfig, arch: Architecture, original: int, device: str, rates: Rates, capacity_gib: float | None
) -> DeviceEstimate:
    """Time, hours and memory on one device. Time per candidate = sum over kinds of FLOPs / rate (+ traffic /
    bandwidth and forwards x a forward's fixed cost on a CPU); hours = sum over stages of candidates x that time
    (racing: the initial population in full, each child at the measured share of its windows). Times are None
    where `withheld_time` says the model does not hold."""
    kind: Literal["cpu", "gpu"] = "cpu" if device == "cpu" else "gpu"
    dtype = worker_dtype(config, kind)
    stages = stage_estimates(config, arch, original, dtype)
    budget = search_budget(config, original)
    forwards = [forwards_per_candidate(config, s.length, s.windows, kind) for s in stages]
    per_candidate = [
        seconds(s.flops_per_candidate, rates, s.elementwise_bytes_per_candidate, count)
        for s, count in zip(stages, forwards, strict=True)
    ]
    fixed = rates.forward_fixed_cost if kind == "cpu" else gpu_forward_overhead(arch.num_layers)
    overheads = [count * (fixed or 0.0) for count in forwards]
    # a CPU's time holds its fixed cost already; a GPU's leaves the assumed overhead out, so it is added here
    totals = per_candidate if kind == "cpu" else [t + o for t, o in zip(per_candidate, overheads, strict=True)]
    shares = [o / t for o, t in zip(overheads, totals, strict=True)]
    withheld = withheld_time(stages, shares, fixed or 0.0, kind)
    per_backward = [backward_window_seconds(config, s, rates, kind) for s in stages]
    hours = sum(s.candidates * t + s.backward_windows * b for s, t, b in zip(stages, per_candidate, per_backward,
                                                                             strict=True)) / 3600  # fmt: skip
    hours_racing = None
    if budget.racing_child_fraction is not None:
        children = raced_children(config)
        share = budget.racing_child_fraction[0]
        racing = [(s.candidates - children + children * share) * t for s, t in zip(stages, per_candidate, strict=True)]
        hours_racing = sum(racing) / 3600
    longest = max(stages, key=lambda s: s.length)
    shape = forward_shape(config, longest.length, longest.windows, kind)
    gpus = config.workers.num_workers * config.workers.num_gpus_per_worker
    memory = worker_memory(arch, shape, dtype, config.model.attn_implementation)
    split = split_gpus(config.workers.num_gpus_per_worker, kind)
    # a layer split is a pipeline: one GPU of the N computes at a time, so device time is N x a worker's time
    hours, hours_racing = hours * split, None if hours_racing is None else hours_racing * split
    return DeviceEstimate(
        device=device,
        dtype=dtype,
        rates=rates,
        rows_per_forward=shape.rows,
        memory=memory,
        headroom=gpu_headroom(memory, shape, arch) if kind == "gpu" else 0.0,
        memory_capacity_gib=capacity_gib,
        forwards_per_candidate=forwards[-1],
        fixed_cost_share=max(shares) if fixed is not None else None,
        time_withheld=withheld,
        seconds_per_candidate=None if withheld else per_candidate[-1],
        hours=None if withheld else hours,
        hours_racing=None if withheld else hours_racing,
        devices_in_parallel=gpus if kind == "gpu" and gpus > 0 else None,
        utilisation=busy_share(config, arch, original, longest.windows) if kind == "gpu" else None,
        gpus_per_worker=split,
        device_plan=worker_plan(memory, arch.num_layers, split, capacity_gib),
        **gradient_device_fields(
            config, arch, longest, dtype, kind, None if withheld else per_backward[-1], capacity_gib
        ),
    )


def busy_share(config: JobConfig, arch: Architecture, original: int, windows: int) -> Utilisation:
    """The workers' busy share; c (a backward window's cost) only matters where there are backward passes."""
    c = backward_cost(config, arch, original) if gradient_steps(config) else 0.0
    return utilisation(config, windows, c)


def gradient_device_fields(
    config: JobConfig,
    arch: Architecture,
    longest: StageEstimate,
    dtype: str,
    kind: Literal["cpu", "gpu"],
    seconds_per_backward: float | None,
    capacity_gib: float | None = None,
) -> dict[str, Any]:
    """DeviceEstimate's gradient fields: none unless the optimizer takes backward passes. On a GPU of known
    capacity the checkpoints are where the scorer would keep them (`memory.offloaded`)."""
    if not longest.backward_windows:
        return {}
    shape = gradient_shape(config, longest.length, kind)
    memory = gradient_memory(arch, shape, dtype, config.model.attn_implementation)
    if kind == "gpu" and config.workers.checkpoints != "device":
        always = config.workers.checkpoints == "host"
        if always or capacity_gib is not None:
            gpus = split_gpus(config.workers.num_gpus_per_worker, kind)
            memory = offloaded(memory, 0.0 if always else capacity_gib * 2**30, gpus)
    return {
        "gradient_memory": memory,
        "gradient_headroom": gpu_headroom(memory, shape, arch) if kind == "gpu" else 0.0,
        "gradient_rows_per_forward": shape.rows,
        "seconds_per_backward_window": seconds_per_backward,
    }


def withheld_time(
    stages: tuple[StageEstimate, ...], shares: list[float], fixed: float, kind: Literal["cpu", "gpu"]
) -> str | None:
    """Why no time is given, or None. Above FIXED_COST_SHARE_LIMIT of a candidate's time in a forward's fixed
    cost, the estimate rests on its least certain term: on a CPU a difference of two sub-millisecond timings, which
    leaves out what tiny ops cost beyond dispatch (bench/estimate_accuracy.py measured it off by more than 25%); on
    a GPU the assumed launch overhead of eager ops, which the FLOP count does not see at all."""
    worst = max(range(len(stages)), key=lambda i: shares[i])
    if shares[worst] <= FIXED_COST_SHARE_LIMIT:
        return None
    what = {
        "cpu": "on this CPU: Python, module calls, op dispatch); above "
        f"{FIXED_COST_SHARE_LIMIT:.0%} the estimate missed real scoring by over 25% (bench/estimate_accuracy.py)",
        "gpu": "assumed: ~10 us of launch per eager op, hardware.py GPU_OP_OVERHEAD_S); the model is too small for "
        "its FLOPs to set a GPU's time",
    }[kind]
    return (
        f"at {stages[worst].length} tokens a candidate's time is {shares[worst]:.0%} forwards' fixed cost "
        f"({fixed * 1e3:.2g} ms each {what}. Time a short real run instead: longrope search CONFIG --set "
        "search.generations=0"
    )


def job_estimate(
    config: JobConfig, arch: Architecture, source: str, devices: list[tuple[str, Rates, float | None]]
) -> JobEstimate:
    """Everything `longrope estimate` prints, for each (device name, rates, memory GiB or None)."""
    original = resolve_original_length(config, arch)
    budget = search_budget(config, original)
    first = "cpu" if devices and devices[0][0] == "cpu" else "gpu"
    fraction = budget.racing_child_fraction
    return JobEstimate(
        model=arch.name,
        model_source=source,
        parameters=parameter_count(arch),
        original_length=original,
        stages=stage_estimates(config, arch, original, worker_dtype(config, first)),
        candidates=budget.candidates,
        window_evaluations=window_evaluations(config, budget),
        window_evaluations_racing=None if fraction is None else window_evaluations(config, budget, fraction[0]),
        racing_child_fraction=fraction,
        devices=tuple(device_estimate(config, arch, original, *device) for device in devices),
        gradient_steps=gradient_steps(config),
        gradient_windows=gradient_windows(config) if gradient_steps(config) else 0,
        backward_window_passes=sum(stage.backward_windows for stage in budget.stages),
    )
