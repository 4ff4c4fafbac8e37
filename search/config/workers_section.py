"""The `workers:` section: where candidates are scored (a local Ray, or a cluster) and with what resources."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from longrope.search.config.strict import MAX_COUNT, Strict


class WorkersConfig(Strict):
    address: str | None = Field(
        default=None, description='null: an embedded local Ray; "auto" or "ray://host:10001": a running cluster'
    )
    num_workers: int = Field(default=1, ge=1, le=100_000, description="Ray actors, each with its own model copy")
    num_gpus_per_worker: float = Field(
        default=0.0,
        ge=0,
        le=1024,
        description="GPUs per worker: a fraction shares one GPU; 2 or more (whole GPUs) spread the model's layers "
        "over them (for a model too big for one GPU)",
    )
    num_cpus_per_worker: float = Field(default=1.0, gt=0, le=1024, description="CPUs per worker (may be fractional)")
    candidates_per_forward: int = Field(
        default=4, ge=1, le=MAX_COUNT, description="candidates scored in one forward pass (as extra batch rows)"
    )
    batch_size: int = Field(default=4, ge=1, le=MAX_COUNT, description="candidates per call to a worker")
    local_num_cpus: int | None = Field(
        default=None, ge=1, le=100_000, description="CPUs the embedded Ray may use; null: all"
    )
    retries: int = Field(
        default=2,
        ge=0,
        le=100,
        description="times a candidate whose scoring raised (an OOM, a bad GPU) is sent again, to another worker "
        "where one is left, before it is recorded as failed (ranked last; the run goes on)",
    )
    max_restarts: int = Field(
        default=1, ge=0, le=1000, description="times Ray restarts a worker that died (its process or node lost)"
    )
    restart_timeout_s: float = Field(
        default=120.0,
        gt=0,
        le=86_400,
        description="seconds a dead worker has to come back (restarted, model reloaded) before it is given up; "
        "allow for loading the model from network storage",
    )
    checkpoints: Literal["auto", "host", "device"] = Field(
        default="auto",
        description="where a gradient pass keeps its layer checkpoints: auto (host memory when they would take more "
        "than a third of the GPU's free memory, else the device), host, or device; the scores are the same",
    )
    accelerator_type: str | None = Field(
        default=None,
        min_length=1,
        max_length=100,
        description='pin workers to nodes of this Ray accelerator type ("H100", "A100", "L4"); null: any',
    )

    @field_validator("accelerator_type")
    @classmethod
    def _accelerator_name(cls, value: str | None) -> str | None:
        """Ray takes any name and then never places the actor on a typo: refuse what cannot be one."""
        if value is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:-]*", value):
            raise ValueError(f"must be a Ray accelerator type such as H100 (letters, digits, _ . : -), got {value!r}")
        return value

    @field_validator("num_gpus_per_worker", "num_cpus_per_worker")
    @classmethod
    def _ray_amount(cls, value: float) -> float:
        return ray_resource_amount(value)

    @field_validator("num_gpus_per_worker")
    @classmethod
    def _whole_gpus_to_spread(cls, value: float) -> float:
        """Above one GPU a worker spreads its layers over whole GPUs (workers/device_plan.py); Ray too takes a
        resource above 1 only whole."""
        if value > 1 and value != int(value):
            raise ValueError(f"must be at most 1, or a whole number of GPUs to spread the model over, got {value}")
        return value


def ray_resource_amount(value: float) -> float:
    """Ray refuses a fractional resource below 0.0001 (`.options()` raises "The precision of the fractional
    quantity of resource ... cannot go beyond 0.0001"); refuse it here, before anything is written."""
    if 0 < value < 1e-4:
        raise ValueError(f"must be 0 or at least 0.0001 (Ray's precision for resources), got {value}")
    return value
