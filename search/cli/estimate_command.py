"""`longrope estimate CONFIG`: what a search will cost (FLOPs, candidates, memory per worker, GPU-hours) before
renting anything. Reads the job config, the model's config.json and the data sources present on this machine (not
tokenized: a job whose documents are shorter than its windows is refused as `validate` refuses it): no weights, no
torch (except `--gpu cpu`, which times this machine's CPU at the model's shapes)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from longrope.search.config.job_config import JobConfig
from longrope.search.config.strict import JobConfigError
from longrope.search.cost import cpu_rates  # torch only inside its functions: `estimate` stays light
from longrope.search.cost.architecture import (
    KNOWN_MODELS,
    Architecture,
    known_model,
    model_config_path,
    read_config_json,
)
from longrope.search.cost.budget import backward_cost, per_search_text, search_budget
from longrope.search.cost.estimate import DeviceEstimate, JobEstimate, job_estimate, resolve_original_length
from longrope.search.cost.gpu_split import pipeline_text
from longrope.search.cost.hardware import DEFAULT_MFU, Rates, find_gpu, gpu_rates
from longrope.search.cost.memory import forward_shape, worker_dtype, worker_threads
from longrope.search.job.validation_checks import data_source_checks, least_window_tokens
from longrope.search.optimizers.factory import load_job_config
from longrope.workers.families import load_overrides
from longrope.workers.reference_recipe import reference_model_dir

DEFAULT_GPUS = ("H100-SXM", "A100")
REFERENCE = "reference"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    estimate = subparsers.add_parser(
        "estimate", help="parameters, FLOPs, candidates, memory per worker and GPU-hours of a job, before running it"
    )
    estimate.add_argument("config", help="job config YAML")
    estimate.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a field")
    estimate.add_argument(
        "--gpu",
        action="append",
        metavar="NAME",
        help=f"a GPU to price (repeat; default {' and '.join(DEFAULT_GPUS)}), or 'cpu' to time this machine's CPU",
    )
    estimate.add_argument(
        "--mfu", type=float, default=DEFAULT_MFU, help=f"model FLOPs utilisation on a GPU (default {DEFAULT_MFU})"
    )
    estimate.add_argument(
        "--model-config",
        metavar="PATH|NAME",
        help="the model's config.json (or its directory), or a known model name, when model.path is not here",
    )
    estimate.add_argument("--json", action="store_true", help="print the estimate as JSON")
    estimate.set_defaults(handler=run_estimate_command)


def resolve_architecture(config: JobConfig, model_config: str | None) -> tuple[Architecture, str, dict[str, Any]]:
    """(architecture, where it came from, the config.json settings it was read from, overrides applied):
    --model-config (a file, a directory or a known name), else model.path's config.json, else the known table by
    model.path's last part: a user pricing a 7B run on a laptop has the config, not the weights."""
    if model_config:
        path = model_config_path(model_config)
        if path.is_file():
            settings = as_loaded(config, read_config_json(path))
            return Architecture.from_hf_config(settings, name=path.parent.name), str(path), settings
        return _known(config, model_config, f"--model-config {model_config!r}: no such file")
    if config.model.path == REFERENCE:
        directory = reference_model_dir()
    else:
        directory = config.model.directory() if config.model.is_gguf else Path(config.model.path)
    path = directory / "config.json"
    if path.is_file():
        name = "reference model" if config.model.path == REFERENCE else directory.name
        settings = as_loaded(config, read_config_json(path))
        return Architecture.from_hf_config(settings, name=name), str(path), settings
    return _known(config, config.model.path, f"model.path: no config.json at {str(directory)!r}")


def as_loaded(config: JobConfig, settings: dict[str, Any]) -> dict[str, Any]:
    """A model's config.json settings as the workers load the model: `model.sliding_window: full` turns its window
    off (and with it `use_sliding_window` and the layer types, where the config has them), then the job's own
    `model.config_overrides`."""
    return {**settings, **load_overrides(config.model.config_overrides, config.model.sliding_window, settings)}


def job_backward_cost(config: JobConfig, original_length: int | None = None) -> tuple[float, str]:
    """(c, the model it was priced for): what `estimate` prices a window's backward pass at, in forwards of it
    (`cost.budget.backward_cost`), for the job's model as `resolve_architecture` finds it (model.path's
    config.json, else the known table); a run gives its job.json's `original_length`. The c of the
    window-equivalents that `status --plot` draws and the TensorBoard scalars count."""
    arch, _, _ = resolve_architecture(config, None)
    original = original_length or resolve_original_length(config, arch)
    return backward_cost(config, arch, original), arch.name


def _known(config: JobConfig, name: str, problem: str) -> tuple[Architecture, str, dict[str, Any]]:
    key = known_model(name)
    if key is None:
        raise JobConfigError(
            f"{problem}, and it is not a known model ({', '.join(KNOWN_MODELS)}); give --model-config PATH "
            "(the model's config.json)"
        )
    settings = as_loaded(config, dict(KNOWN_MODELS[key]))
    source = f"the known architecture of {key} (public config.json numbers; no file read)"
    return Architecture.from_hf_config(settings, name=key), source, settings


def device_rates(
    config: JobConfig, arch: Architecture, settings: dict[str, Any], names: list[str], mfu: float
) -> list[tuple[str, Rates, float | None]]:
    """(name, rates, memory GiB) per --gpu: a GPU's datasheet peak x MFU, or this CPU measured at the shapes of
    the job's longest forward, cut to 32768 positions and attention to 8192 (`cpu_rates.replay_shape`);
    `settings`: the model's config.json, for the fixed cost of a forward."""
    if not 0 < mfu <= 1:
        raise JobConfigError(f"--mfu = {mfu}: must be in (0, 1]")
    devices = []
    for name in names:
        if name.lower() == "cpu":
            devices.append(("cpu", _cpu_rates(config, arch, settings), _ram_gib()))
        else:
            gpu = find_gpu(name)
            devices.append((gpu.name, gpu_rates(gpu, mfu), gpu.memory_gib))
    return devices


def _cpu_rates(config: JobConfig, arch: Architecture, settings: dict[str, Any]) -> Rates:
    """Timed at the shapes of the job's longest forward, with a worker's torch threads (no more than this machine's
    CPUs)."""
    stage = max(search_budget(config, resolve_original_length(config, arch)).stages, key=lambda s: s.length)
    shape = forward_shape(config, stage.length, stage.windows, "cpu")
    threads = min(worker_threads(config, os.environ.get("OMP_NUM_THREADS")), os.cpu_count() or 1)
    dtype, attention = worker_dtype(config, "cpu"), config.model.attn_implementation
    return cpu_rates.measure_cpu_rates(arch, shape, dtype, attention, threads=threads, model_config=settings)


def _ram_gib() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def run_estimate_command(args: argparse.Namespace) -> int:
    """The data sources on this machine are checked first, as `search` checks them (their documents' bytes against
    a window's tokens), so a job that cannot run is not priced, and a `.gguf` model is not converted for it."""
    config = load_job_config(args.config, args.set)
    data_source_checks(config, tokens=least_window_tokens(config), here_only=True)
    arch, source, settings = resolve_architecture(config, args.model_config)
    devices = device_rates(config, arch, settings, args.gpu or list(DEFAULT_GPUS), args.mfu)
    estimate = job_estimate(config, arch, source, devices)
    print(json.dumps(estimate.model_dump(mode="json"), indent=2) if args.json else format_estimate(estimate, config))
    return 0


# ----------------------------------------------------------------------------------------------------- text


def local_share(flops) -> str:
    """The windowed layers' share of a candidate's FLOPs, where the model has any."""
    return f", windowed-layer attention {flops.local_attention / flops.total:.0%}" if flops.local_attention else ""


def _count(value: float) -> str:
    for size, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.3g}"


def _gib(value: float) -> str:
    return f"{value / 2**30:.3g} GiB"


def _hours(value: float) -> str:
    return f"{value * 60:.3g} min" if value < 1 else f"{value:.3g} h"


def format_estimate(estimate: JobEstimate, config: JobConfig) -> str:
    """Plain lines: the model, FLOPs per candidate per stage, the candidate budget, then one block per device."""
    lines = [
        f"model          {estimate.model}: {_count(estimate.parameters)} parameters, from {estimate.model_source}",
        f"lengths        original {estimate.original_length} -> target {config.target_length}",
    ]
    for stage in estimate.stages:
        flops = stage.flops_per_candidate
        lines.append(
            f"FLOPs/cand.    {flops.total:.3g} at {stage.length} tokens x {stage.windows} windows (linear "
            f"{flops.linear / flops.total:.0%}, attention {flops.attention / flops.total:.0%} "
            f"[{config.model.attn_implementation}]{local_share(flops)}, lm_head {flops.lm_head / flops.total:.0%})"
        )
    stages = f" x {len(estimate.stages)} stages" if len(estimate.stages) > 1 else ""
    lines.append(
        f"candidates     {estimate.candidates} ({per_search_text(config)}{stages}; early stop ignored: an upper "
        f"bound), {estimate.window_evaluations:.0f} window evaluations"
    )
    if estimate.backward_window_passes:
        lines.append(gradient_text(estimate))
    if estimate.racing_child_fraction is not None:
        mean, low, high = estimate.racing_child_fraction
        lines.append(
            f"racing         a child scores {mean:.2f} ({low:.2f}-{high:.2f}) of its windows (measured at 8 windows, "
            f"docs/search-cost.md): {estimate.window_evaluations_racing:.0f} window evaluations expected"
        )
    total = sum(stage.total_flops for stage in estimate.stages)
    lines.append(f"total FLOPs    {total:.3g} (upper bound)")
    for device in estimate.devices:
        lines += device_lines(device)
    return "\n".join(lines)


def gradient_text(estimate: JobEstimate) -> str:
    """The backward passes: how many, and what one adds to its window's forward in FLOPs."""
    stage = estimate.stages[-1]
    extra = stage.flops_per_backward_window.total
    forward = stage.flops_per_candidate.total / stage.windows
    return (
        f"backward       {estimate.gradient_steps} steps x {estimate.gradient_windows} window(s) a search: "
        f"{estimate.backward_window_passes} backward window passes, each {extra:.3g} FLOPs beyond its forward "
        f"({extra / forward:.2g} forwards: the checkpointed forward again, then the backward)"
    )


def device_lines(device: DeviceEstimate) -> list[str]:
    """One device's block: where its rates come from, memory per worker, time (or why none), and the CPU's rates."""
    memory = device.memory
    fits = "" if device.fits is None else (" fits" if device.fits else " DOES NOT FIT")
    capacity = "" if device.memory_capacity_gib is None else f" of {device.memory_capacity_gib:.0f} GiB:{fits}"
    if device.gpus_per_worker > 1:  # the fit is the busiest GPU's, on its own line
        capacity = f" over {device.gpus_per_worker} GPUs"
    attention = f", attention matrix {_gib(memory.attention_matrix)}" if memory.attention_matrix else ""
    lines = [
        f"\n{device.device}: {device.rates.source}",
        f"  memory/worker  {_gib(memory.peak + device.headroom)}{capacity} ({device.dtype} weights "
        f"{_gib(memory.weights)} + the larger of the forward {_gib(memory.forward_peak)} [keys/values "
        f"{_gib(memory.keys_values)}, layer {_gib(memory.layer_activations)}{attention}] and the loss "
        f"{_gib(memory.loss_chunk)}{_headroom_text(device.headroom)}; {device.rows_per_forward} sequence(s) a forward)",
    ]
    if device.gradient_memory is not None:
        lines.append(gradient_memory_line(device))
    lines += split_lines(device)
    if device.time_withheld:
        return [*lines, f"  time           not estimated: {device.time_withheld}", *_rates_lines(device.rates)]
    racing = f" ({_hours(device.hours_racing)} with racing)" if device.hours_racing else ""
    backward = ""
    if device.seconds_per_backward_window is not None:
        backward = f" + {device.seconds_per_backward_window:.3g} s per backward window pass"
    lines.append(
        f"  time           {device.seconds_per_candidate:.3g} s per candidate{backward}; {_hours(device.hours)} "
        f"device time for the whole search{racing}"
    )
    if device.gpus_per_worker > 1:
        lines.append(f"  pipeline       {pipeline_text(device.gpus_per_worker)}")
    if device.wall_hours is not None:
        busy = device.utilisation
        lines.append(
            f"  wall           {_hours(device.wall_hours)} on the config's {device.devices_in_parallel:g} GPUs, "
            f"busy {busy.value:.2f} of the time ({busy.basis})"
        )
    return lines + _rates_lines(device.rates, device)


def split_lines(device: DeviceEstimate) -> list[str]:
    """A worker spread over GPUs: the GPUs its weights need at the plan's share (workers/device_plan.py), and the
    busiest GPU's peak against one GPU's memory (none on one device)."""
    if device.gpus_per_worker < 2:
        return []
    gpus, lines = device.gpus_per_worker, []
    plan = device.device_plan
    if plan is not None:
        layers = "/".join(str(count) for count in plan.layers_per_device)
        lines.append(
            f"  GPUs/worker    needs {plan.gpus_needed} x {_gib(plan.gpu_memory)} for the weights at "
            f"{plan.weight_share:g} of each; {gpus} given (max_memory {_gib(plan.max_memory[0])} each, layers "
            f"{layers}){'' if plan.fits else ': TOO FEW'}"
        )
    if device.memory_per_gpu is not None:
        fits = " fits" if device.fits else " DOES NOT FIT"
        lines.append(
            f"  memory/GPU     {_gib(device.memory_per_gpu)} of {device.memory_capacity_gib:.0f} GiB:{fits} (the "
            f"busiest GPU: 1/{gpus} of the weights {_gib(device.memory.weights / gpus)} and of any checkpoints, one "
            "layer's activations or the loss, and headroom)"
        )
    return lines


def gradient_memory_line(device: DeviceEstimate) -> str:
    """A gradient pass's peak (estimate.gradient_memory) and what makes it up."""
    memory = device.gradient_memory
    return (
        f"  memory/grad.   {_gib(memory.peak + device.gradient_headroom)} a gradient pass (weights "
        f"{_gib(memory.weights)} + {_checkpoints_text(memory)} + the larger of "
        f"the forward {_gib(memory.forward_peak)} with one layer's backward {_gib(memory.layer_backward)} and the "
        f"loss {_gib(memory.loss_chunk)}{_headroom_text(device.gradient_headroom)}; "
        f"{device.gradient_rows_per_forward} sequence(s) a forward)"
    )


def _checkpoints_text(memory) -> str:
    """Where a gradient pass's checkpoints are: on the device, or offloaded to the host."""
    if memory.host_checkpoints:
        return f"checkpoints 0 [{_gib(memory.host_checkpoints)} in host memory: too big for the GPU]"
    return f"checkpoints {_gib(memory.checkpoints)} [a hidden state per layer]"


def _headroom_text(headroom: float) -> str:
    """A GPU's headroom, named (none on a CPU)."""
    if not headroom:
        return ""
    return f" + headroom {_gib(headroom)} [CUDA context, float32 cos/sin, allocator slack]"


def _rates_lines(rates: Rates, device: DeviceEstimate | None = None) -> list[str]:
    """The CPU's measured rates (none for a GPU): per kind, against a 2048^2 matmul, and a forward's fixed cost."""
    if not rates.square_matmul:
        return []
    square = rates.square_matmul
    local = f" (windowed layers {rates.local_attention / 1e9:.1f})" if rates.local_attention else ""
    fixed = ""
    if rates.forward_fixed_cost is not None:
        fixed = f"; a forward's fixed cost {rates.forward_fixed_cost * 1e3:.2g} ms"
        if device is not None and device.fixed_cost_share is not None:
            fixed += f" ({device.forwards_per_candidate:.3g} a candidate, {device.fixed_cost_share:.0%} of its time)"
    return [
        f"  rates          linear {rates.linear / 1e9:.1f}, attention {rates.attention / 1e9:.1f}{local}, "
        f"lm_head+loss {rates.lm_head / 1e9:.1f} GFLOP/s ({rates.linear / square:.2f}, "
        f"{rates.attention / square:.2f}, {rates.lm_head / square:.2f} of a 2048^2 matmul's "
        f"{square / 1e9:.1f}); elementwise {rates.memory / 1e9:.1f} GB/s{fixed}"
    ]
