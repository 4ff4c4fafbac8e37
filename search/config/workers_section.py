"""The `workers:` section: where candidates are scored (a local Ray, or a cluster) and with what resources."""

from __future__ import annotations

from pydantic import Field, field_validator

from longrope.search.config.strict import MAX_COUNT, Strict


class WorkersConfig(Strict):
    address: str | None = Field(
        default=None, description='null: an embedded local Ray; "auto" or "ray://host:10001": a running cluster'
    )
    num_workers: int = Field(default=1, ge=1, le=100_000, description="Ray actors, each with its own model copy")
    num_gpus_per_worker: float = Field(default=0.0, ge=0, le=1024, description="GPUs per worker (may be fractional)")
    num_cpus_per_worker: float = Field(default=1.0, gt=0, le=1024, description="CPUs per worker (may be fractional)")
    candidates_per_forward: int = Field(
        default=4, ge=1, le=MAX_COUNT, description="candidates scored in one forward pass (as extra batch rows)"
    )
    batch_size: int = Field(default=4, ge=1, le=MAX_COUNT, description="candidates per call to a worker")
    local_num_cpus: int | None = Field(
        default=None, ge=1, le=100_000, description="CPUs the embedded Ray may use; null: all"
    )

    @field_validator("num_gpus_per_worker", "num_cpus_per_worker")
    @classmethod
    def _ray_amount(cls, value: float) -> float:
        return ray_resource_amount(value)


def ray_resource_amount(value: float) -> float:
    """Ray refuses a fractional resource below 0.0001 (`.options()` raises "The precision of the fractional
    quantity of resource ... cannot go beyond 0.0001"); refuse it here, before anything is written."""
    if 0 < value < 1e-4:
        raise ValueError(f"must be 0 or at least 0.0001 (Ray's precision for resources), got {value}")
    return value
