"""Placement arithmetic: how large each worker actor is and how many of them the Ray cluster can hold.

Pure functions of the job's `PoolSpec` and what Ray reports (`ray.cluster_resources()`, `ray.nodes()`), so they
are tested without a cluster. Starting only what fits matters because Ray holds an actor it cannot place as
pending, without a word, and the batches queued on it would wait forever.
"""

from __future__ import annotations

import math
import warnings

from longrope.workers.errors import WorkerPoolError
from longrope.workers.specs import PoolSpec


def placeable_workers(num_cpus: float, num_gpus: float, nodes: list[dict]) -> int:
    """How many actors of (num_cpus, num_gpus) the alive nodes can hold at once, node by node."""
    total = 0
    for node in nodes:
        if not node.get("Alive", True):
            continue
        resources = node.get("Resources", {})
        fits = [math.floor(resources.get("CPU", 0) / num_cpus + 1e-9)] if num_cpus > 0 else []
        if num_gpus > 0:
            fits.append(math.floor(resources.get("GPU", 0) / num_gpus + 1e-9))
        total += min(fits) if fits else 0
    return total


def workers_to_start(spec: PoolSpec, num_cpus: float, num_gpus: float, nodes: list[dict]) -> int:
    """`spec.num_workers`, or fewer (with a warning) when the cluster cannot place that many: a worker that is
    never scheduled would hold its queued batches forever."""
    placeable = placeable_workers(num_cpus, num_gpus, nodes)
    if placeable == 0:
        raise WorkerPoolError(
            f"workers.num_workers = {spec.num_workers}: no node of the Ray cluster can place a worker of "
            f"{num_cpus:g} CPUs and {num_gpus:g} GPUs"
        )
    if placeable < spec.num_workers:
        warnings.warn(
            f"workers.num_workers = {spec.num_workers}: the Ray cluster can place only {placeable} workers of "
            f"{num_cpus:g} CPUs and {num_gpus:g} GPUs; starting {placeable}",
            stacklevel=3,
        )
    return min(spec.num_workers, placeable)


def actor_resources(spec: PoolSpec, cluster: dict[str, float]) -> tuple[float, float]:
    """(num_cpus, num_gpus) for each worker actor.

    On a cluster with no GPU at all, GPU workers become CPU workers (with a warning) instead of waiting forever
    for a GPU; a worker larger than the whole cluster is an error naming the field.
    """
    num_gpus = spec.num_gpus_per_worker
    if num_gpus > 0 and cluster.get("GPU", 0) == 0:
        warnings.warn(
            f"workers.num_gpus_per_worker = {num_gpus} but the Ray cluster has no GPU; scoring on CPUs "
            f"({spec.num_cpus_per_worker} per worker)",
            stacklevel=3,
        )
        num_gpus = 0.0
    for field_name, need, resource in (
        ("num_cpus_per_worker", spec.num_cpus_per_worker, "CPU"),
        ("num_gpus_per_worker", num_gpus, "GPU"),
    ):
        if need > cluster.get(resource, 0):
            raise WorkerPoolError(
                f"workers.{field_name} = {need}: the Ray cluster has only {cluster.get(resource, 0):g} {resource}s"
            )
    return spec.num_cpus_per_worker, num_gpus


def actor_options(spec: PoolSpec, num_cpus: float, num_gpus: float) -> dict:
    """Ray's `.options()` for each worker actor: its size, how often Ray restarts it, and the accelerator type it
    is pinned to (`workers.accelerator_type`; absent when null, so any GPU will do)."""
    options = {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_restarts": spec.max_restarts, "max_task_retries": 0}
    if spec.accelerator_type is not None:
        options["accelerator_type"] = spec.accelerator_type
    return options
