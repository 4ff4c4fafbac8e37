"""How workers load their model and where they run: plain values, importable without Ray or torch (`validate`
resolves them without starting anything)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelSpec:
    """How each worker loads its model copy and scores (everything a worker needs, nothing it doesn't)."""

    model_dir: str
    device: str = "auto"
    dtype: str = "auto"
    attn_implementation: str = "sdpa"
    trust_remote_code: bool = False
    config_overrides: dict = field(default_factory=dict)
    candidates_per_forward: int = 4
    tokens_per_forward: int | None = None  # None: the scorer's default for the device
    loss_chunk_tokens: int = 1024
    checkpoints: str = "auto"  # where a gradient pass keeps its layer checkpoints (Scorer.checkpoint_home)
    gpus: int = 1  # GPUs the model is spread over (workers.num_gpus_per_worker when >= 2; workers/device_plan.py)


@dataclass(frozen=True)
class PoolSpec:
    """Where the workers run and how big each is."""

    num_workers: int = 1
    num_gpus_per_worker: float = 0.0
    num_cpus_per_worker: float = 1.0
    address: str | None = None  # None: an embedded local Ray; "auto" or "ray://host:port": an existing cluster
    batch_size: int = 4  # candidates per call
    calls_per_worker: int = 2
    max_restarts: int = 1  # times Ray restarts a dead worker
    restart_timeout_s: float = 120.0  # a dead worker not back (model reloaded) by then is given up
    retries: int = 2  # times a task that raised is sent again, to another worker where one is left
    retire_after_failures: int = 3  # a worker whose tasks raised this many times in a row is replaced
    accelerator_type: str | None = None  # Ray's `accelerator_type` for the actors ("H100"); None: any
    start_warning_s: float = 300.0  # warn once when no worker has answered by then (pending placement?)
    local_num_cpus: int | None = None  # CPUs for the embedded Ray (default: all)
    local_num_gpus: int | None = None
