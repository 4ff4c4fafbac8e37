"""The worker pool on Ray: one actor per worker slot, each with one model copy, fed candidates as they free up.

Results come back as they finish (no barrier per batch), so a slow worker never idles the others; each
worker keeps `calls_per_worker` batches queued so it never waits for the coordinator between batches. A
worker that dies loses only its in-flight batches, which go back to the front of the queue for the others;
Ray restarts the actor where it can (`max_restarts`), and the pool takes it back once it answers again. The
caller gets every result exactly once. When no worker is left, the pool raises one `WorkerPoolError`.
"""

from __future__ import annotations

import os
import time
import warnings
from collections import deque
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import ray
from ray.exceptions import RayActorError

from longrope.encodings import RopeMethod
from longrope.workers.errors import WorkerPoolError
from longrope.workers.scorer import CandidateScore

Key = Hashable


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


@dataclass(frozen=True)
class PoolSpec:
    """Where the workers run and how big each is."""

    num_workers: int = 1
    num_gpus_per_worker: float = 0.0
    num_cpus_per_worker: float = 1.0
    address: str | None = None  # None: an embedded local Ray; "auto" or "ray://host:port": an existing cluster
    batch_size: int = 4  # candidates per call
    calls_per_worker: int = 2
    max_restarts: int = 1
    restart_timeout_s: float = 120.0
    local_num_cpus: int | None = None  # CPUs for the embedded Ray (default: all)
    local_num_gpus: int | None = None


class ScoringWorker:
    """The Ray actor: loads the model once, receives the windows once, then scores batches."""

    def __init__(self, spec: ModelSpec, windows: np.ndarray):
        import torch

        from longrope.workers.models import load_model
        from longrope.workers.scorer import Scorer

        if spec.device in ("auto", "cpu") and not torch.cuda.is_available():
            torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        model, rope = load_model(
            spec.model_dir,
            device=spec.device,
            dtype=spec.dtype,
            attn_implementation=spec.attn_implementation,
            trust_remote_code=spec.trust_remote_code,
            config_overrides=spec.config_overrides,
        )
        self.scorer = Scorer(
            model,
            torch.from_numpy(np.asarray(windows)),
            rope.method.original_inv_freq(),
            candidates_per_forward=spec.candidates_per_forward,
            tokens_per_forward=spec.tokens_per_forward,
            loss_chunk_tokens=spec.loss_chunk_tokens,
        )
        self.device = str(self.scorer.device)

    def ready(self) -> dict:
        return {"pid": os.getpid(), "device": self.device, "node": ray.get_runtime_context().get_node_id()}

    def score(self, batch: Sequence[tuple[Key, RopeMethod]]) -> list[tuple[Key, CandidateScore]]:
        keys = [key for key, _ in batch]
        return list(zip(keys, self.scorer.score([method for _, method in batch]), strict=True))


def ensure_ray(spec: PoolSpec) -> None:
    """Connect to the cluster at `spec.address`, or start a quiet embedded Ray when there is none."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    quiet = {"log_to_driver": False, "logging_level": "ERROR"}
    try:
        if not spec.address:
            ray.init(num_cpus=spec.local_num_cpus, num_gpus=spec.local_num_gpus, include_dashboard=False, **quiet)
        elif spec.address.startswith("ray://"):
            ray.init(address=spec.address)  # Ray Client takes no local-node options
        else:
            ray.init(address=spec.address, **quiet)
    except (ConnectionError, ValueError, RuntimeError, SystemExit) as exc:  # Ray exits when it gives up connecting
        raise WorkerPoolError(f"workers.address = {spec.address!r}: cannot connect to Ray ({exc})") from None


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


PROBE_INTERVAL_S = 0.5


@dataclass
class _Worker:
    actor: ray.actor.ActorHandle
    index: int
    in_flight: int = 0
    dead: bool = False
    failed_since: float | None = None  # set while the worker is down and being probed
    next_probe_at: float | None = None  # when to ask a down worker again (None: a probe is out)

    @property
    def usable(self) -> bool:
        return not self.dead and self.failed_since is None


@dataclass
class _Call:
    worker: _Worker
    batch: list[tuple[Key, RopeMethod]] = field(default_factory=list)
    probe: bool = False


class WorkerPool:
    """Candidates in, (key, CandidateScore) out, in completion order."""

    def __init__(self, model: ModelSpec, windows: np.ndarray, spec: PoolSpec = PoolSpec()):
        if spec.num_workers < 1:
            raise WorkerPoolError(f"workers.num_workers: must be at least 1, got {spec.num_workers}")
        ensure_ray(spec)
        self.spec = spec
        num_cpus, num_gpus = actor_resources(spec, ray.cluster_resources())
        # Held for the pool's lifetime: a restarted actor is built again from these constructor arguments.
        self.windows_ref = ray.put(np.ascontiguousarray(windows, dtype=np.int64))
        actor_class = ray.remote(ScoringWorker).options(
            num_gpus=num_gpus,
            num_cpus=num_cpus,
            max_restarts=spec.max_restarts,
            max_task_retries=0,
        )
        self.workers = [_Worker(actor_class.remote(model, self.windows_ref), i) for i in range(spec.num_workers)]
        self._queue: deque[list[tuple[Key, RopeMethod]]] = deque()
        self._calls: dict[ray.ObjectRef, _Call] = {}
        self.failures = 0

    def worker_info(self) -> list[dict]:
        """Each usable worker's pid, device and node (waits until every worker has loaded its model)."""
        return ray.get([w.actor.ready.remote() for w in self.workers if w.usable])

    def submit(self, candidates: Iterable[tuple[Key, RopeMethod]]) -> None:
        pending = list(candidates)
        size = max(1, self.spec.batch_size)
        self._queue.extend(pending[i : i + size] for i in range(0, len(pending), size))

    def as_completed(self) -> Iterator[tuple[Key, CandidateScore]]:
        """Results of everything submitted, as each batch finishes; returns when all are done."""
        while self._queue or any(not call.probe for call in self._calls.values()):
            self._dispatch()
            if all(w.dead for w in self.workers):
                raise WorkerPoolError(
                    f"worker pool: no worker left ({self.failures} worker failures); "
                    f"{sum(len(b) for b in self._queue)} candidates were not scored"
                )
            ready, _ = ray.wait(list(self._calls), num_returns=1, timeout=PROBE_INTERVAL_S)
            if ready:
                yield from self._collect(ready[0])

    def imap(self, candidates: Iterable[tuple[Key, RopeMethod]]) -> Iterator[tuple[Key, CandidateScore]]:
        self.submit(candidates)
        return self.as_completed()

    def shutdown(self) -> None:
        for worker in self.workers:
            ray.kill(worker.actor, no_restart=True)
        self.workers, self._calls = [], {}

    def _dispatch(self) -> None:
        now = time.monotonic()
        for worker in self.workers:
            if worker.failed_since is not None and worker.next_probe_at is not None and now >= worker.next_probe_at:
                self._calls[worker.actor.ready.remote()] = _Call(worker, probe=True)
                worker.next_probe_at = None
            while worker.usable and self._queue and worker.in_flight < self.spec.calls_per_worker:
                batch = self._queue.popleft()
                self._calls[worker.actor.score.remote(batch)] = _Call(worker, batch)
                worker.in_flight += 1

    def _collect(self, ref: ray.ObjectRef) -> list[tuple[Key, CandidateScore]]:
        call = self._calls.pop(ref)
        try:
            value = ray.get(ref)
        except RayActorError:
            self._on_failure(call)
            return []
        if call.probe:
            call.worker.failed_since = None  # it answered again: back in the pool
            return []
        call.worker.in_flight -= 1
        return value

    def _on_failure(self, call: _Call) -> None:
        """Re-queue lost work; probe the worker until Ray has restarted it or `restart_timeout_s` passes."""
        worker, now = call.worker, time.monotonic()
        if not call.probe:
            worker.in_flight -= 1
            self._queue.appendleft(call.batch)  # lost work goes first, to whoever is free
            if worker.failed_since is None:
                self.failures += 1
                worker.failed_since = now
        if now - worker.failed_since > self.spec.restart_timeout_s:
            worker.dead = True
        elif worker.in_flight == 0 and not any(c.probe and c.worker is worker for c in self._calls.values()):
            worker.next_probe_at = now + PROBE_INTERVAL_S
