"""The worker pool on Ray: one actor per worker slot, each with one model copy, fed candidates as they free up.

Results come back as they finish (no barrier per batch), so a slow worker never idles the others; each
worker keeps `calls_per_worker` batches queued so it never waits for the coordinator between batches. A
worker that dies loses only its in-flight batches, which go back to the front of the queue for the others;
Ray restarts the actor where it can (`max_restarts`), and the pool sends it the windows again and takes it back
once it answers. The caller gets every result exactly once.

The pool fails fast, with the cause: a worker that cannot load its model reports that exception at once (it is
not restarted into the same failure); a worker that has died more often than Ray restarts it is given up at
once; when no worker is left, the pool raises one `WorkerPoolError`. It starts only as many workers as the
cluster can place, so batches never wait on an actor that will never be scheduled.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import threading
import time
import warnings
from collections import deque
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import ray
from ray.exceptions import ActorUnavailableError, RayActorError, RayError, RayTaskError

from longrope.encodings import RopeMethod
from longrope.workers.errors import ModelLoadError, Terminated, WorkerPoolError, one_line
from longrope.workers.ray_guardian import guarded
from longrope.workers.scorer import CandidateScore
from longrope.workers.specs import ModelSpec, PoolSpec

Key = Hashable
WindowRange = tuple[int, int]  # [start, stop) of the job's windows


class Task(NamedTuple):
    """A candidate to score on some windows (None: all of them); with `gradient`, also d NLL / d its factors
    (`Scorer.score_with_gradient`: one candidate, per window)."""

    key: Key
    method: RopeMethod
    windows: WindowRange | None
    gradient: bool = False


class WindowsMissing(RuntimeError):
    """A worker was asked to score before it had its windows: a restarted actor (Ray rebuilt it from its
    constructor arguments, which hold no windows) that the pool has not sent them to yet."""


class ScoringWorker:
    """The Ray actor: loads the model once, receives the windows once (`load`), then scores batches.

    `windows` is one [count, length] array, or a list of them (window sets of different lengths, e.g. compare's
    lengths and objectives) with one loss mask each: the sets share one model copy, so a worker loads the model
    once for all of them. Windows are numbered across the sets in order, and a task's range lies in one set.

    The pool sends the windows by a `load` call after the actor starts, not as constructor arguments: Ray logs an
    error for every actor built from object-store arguments with `max_restarts > 0` (ray-project/ray#53727, a
    restart can fail if those arguments are lost). A restarted actor therefore comes back with its model but no
    windows, says so (`WindowsMissing`), and the pool sends them again before it scores anything there.

    A load that fails is kept as `load_error` instead of killing the actor: Ray would restart it into the same
    failure and the caller would only learn that the actor died. Every call then raises it, so the pool
    reports the real cause at once."""

    def __init__(self, spec: ModelSpec, windows=None, loss_mask=None):
        self.spec, self.load_error, self.device = spec, None, "none"
        self.scorers: list | None = None  # (first window number, scorer of that set), once `load` has run
        self.model = self.rope = None
        try:
            self.model, self.rope = self._load_model(spec)
        except Exception as exc:  # reported by every call, see the class docstring
            self.load_error = f"{type(exc).__name__}: {one_line(exc)}"
        if windows is not None:  # built directly, outside a pool
            self.load(windows, loss_mask)

    def load(self, windows, loss_mask=None) -> dict:
        """Take the windows (once per actor life; a repeated call keeps the first ones); answers as `ready`."""
        if self.scorers is None and self.load_error is None:
            try:
                self._load_windows(*as_window_sets(windows, loss_mask))
            except Exception as exc:  # reported by every call, see the class docstring
                self.load_error = f"{type(exc).__name__}: {one_line(exc)}"
        return self.ready()

    @staticmethod
    def _load_model(spec: ModelSpec):
        import torch

        from longrope.workers.models import load_model

        if spec.device in ("auto", "cpu") and not torch.cuda.is_available():
            torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        return load_model(
            spec.model_dir,
            device=spec.device,
            dtype=spec.dtype,
            attn_implementation=spec.attn_implementation,
            trust_remote_code=spec.trust_remote_code,
            config_overrides=spec.config_overrides,
        )

    def _load_windows(self, windows: list[np.ndarray], loss_masks: list[np.ndarray | None]) -> None:
        import torch

        from longrope.workers.scorer import Scorer

        spec, scorers, first = self.spec, [], 0
        for tokens, mask in zip(windows, loss_masks, strict=True):
            scorer = Scorer(
                self.model,
                torch.from_numpy(np.asarray(tokens)),
                self.rope.method.original_inv_freq(),
                candidates_per_forward=spec.candidates_per_forward,
                tokens_per_forward=spec.tokens_per_forward,
                loss_chunk_tokens=spec.loss_chunk_tokens,
                loss_mask=None if mask is None else torch.from_numpy(np.asarray(mask, dtype=bool)),
            )
            scorers.append((first, scorer))
            first += len(tokens)
        self.scorers = scorers
        self.device = str(scorers[0][1].device)

    def ready(self) -> dict:
        self._check_loaded()
        return {"pid": os.getpid(), "device": self.device, "node": ray.get_runtime_context().get_node_id()}

    def score(self, batch: Sequence[Task]) -> list[tuple[Key, CandidateScore]]:
        """Scores a batch: plain tasks on the same window range share forward passes (`Scorer.score`); a
        gradient task runs alone (`Scorer.score_with_gradient`: its rows carry its own factor leaves)."""
        self._check_loaded()
        batch = [Task(*task) for task in batch]
        results: dict[int, CandidateScore] = {}
        for i, task in enumerate(batch):
            if task.gradient:
                scorer, local = self._scorer_for(task.windows)
                results[i] = scorer.score_with_gradient(task.method, windows=local)
        ranges = {task.windows for task in batch if not task.gradient}
        for windows in sorted(ranges, key=lambda r: (-1, -1) if r is None else r):
            indices = [i for i, task in enumerate(batch) if not task.gradient and task.windows == windows]
            scorer, local = self._scorer_for(windows)
            scores = scorer.score([batch[i].method for i in indices], windows=local)
            results.update(zip(indices, scores, strict=True))
        return [(task.key, results[i]) for i, task in enumerate(batch)]

    def _scorer_for(self, windows: WindowRange | None):
        """The scorer of the set that holds the range, and the range within that set."""
        if windows is None:
            if len(self.scorers) != 1:
                raise ValueError(f"a task without a window range, but the worker holds {len(self.scorers)} sets")
            return self.scorers[0][1], None
        start, stop = windows
        for first, scorer in reversed(self.scorers):
            if start >= first:
                if stop > first + scorer.windows.shape[0]:
                    raise ValueError(f"window range {windows} crosses the end of a window set")
                return scorer, (start - first, stop - first)
        raise ValueError(f"window range {windows} starts before the first window")

    def _check_loaded(self) -> None:
        if self.load_error is not None:
            raise ModelLoadError(f"worker on {os.uname().nodename} could not load the model: {self.load_error}")
        if self.scorers is None:
            raise WindowsMissing(f"worker on {os.uname().nodename} (pid {os.getpid()}) has no windows yet")


def as_window_sets(windows, loss_mask=None) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
    """One window array with its mask, or lists of them, as two lists of equal length."""
    if isinstance(windows, np.ndarray):
        return [windows], [loss_mask]
    windows = list(windows)
    masks = [None] * len(windows) if loss_mask is None else list(loss_mask)
    if not windows or len(masks) != len(windows):
        raise ValueError(f"{len(windows)} window sets and {len(masks)} loss masks")
    return windows, masks


def window_spans(window_sets: Sequence[np.ndarray]) -> list[WindowRange]:
    """The [start, stop) range of each set in the pool's numbering (sets follow each other in order)."""
    spans, first = [], 0
    for tokens in window_sets:
        spans.append((first, first + len(tokens)))
        first += len(tokens)
    return spans


CONNECT_TIMEOUT_S = 10.0


def ensure_ray(spec: PoolSpec) -> None:
    """Connect to the cluster at `spec.address`, or start a new embedded Ray when it is None.

    Embedded means a new local instance (`address="local"`): a plain `ray.init()` would join whatever cluster
    `RAY_ADDRESS` or a running `ray start` points at. A cluster address is first tried with a plain TCP
    connection bounded by CONNECT_TIMEOUT_S, because Ray itself retries an unreachable address for minutes.
    An embedded Ray runs under a guardian process that stops all of it when the driver dies, even by SIGKILL
    (workers/ray_guardian.py); a cluster we only connect to is never touched."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    quiet = {"log_to_driver": False, "logging_level": "ERROR"}
    if spec.address:
        check_reachable(spec.address)
    with kept_sigterm_handler():
        _init_ray(spec, quiet)


@contextlib.contextmanager
def kept_sigterm_handler() -> Iterator[None]:
    """`ray.init` replaces the driver's SIGTERM handler with one that calls sys.exit mid-call (a crash dump);
    keep the caller's own handler where it has one (the CLI turns SIGTERM into a clean stop; Ray still stops its
    processes at exit). Without one, Ray's handler stays, so its processes are not orphaned.

    A SIGTERM that arrives during init meets Ray's handler, whose SystemExit Ray may swallow; the handlers Ray
    installs are wrapped to record the signal (through `ray._private.utils.set_sigterm_handler`, the one place
    Ray installs them), so the stop is raised as `Terminated` once init returns."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main_thread else None
    utils = getattr(getattr(ray, "_private", None), "utils", None)
    ray_setter = getattr(utils, "set_sigterm_handler", None)
    received: list[int] = []
    if callable(previous) and callable(ray_setter):

        def recording_setter(handler):
            def recorded(signum, frame):
                received.append(signum)
                handler(signum, frame)

            ray_setter(recorded)

        utils.set_sigterm_handler = recording_setter
    try:
        yield
    finally:
        if callable(ray_setter):
            utils.set_sigterm_handler = ray_setter
        if callable(previous):
            signal.signal(signal.SIGTERM, previous)
    if received:
        raise Terminated()


def _init_ray(spec: PoolSpec, quiet: dict) -> None:
    try:
        if not spec.address:
            with guarded():  # Ray alone leaves its agents behind a killed driver (workers/ray_guardian.py)
                ray.init(
                    address="local",
                    num_cpus=spec.local_num_cpus,
                    num_gpus=spec.local_num_gpus,
                    include_dashboard=False,
                    **quiet,
                )
        elif spec.address.startswith("ray://"):
            ray.init(address=spec.address)  # Ray Client takes no local-node options
        else:
            ray.init(address=spec.address, **quiet)
    except SystemExit as exc:
        if exc.code == signal.SIGTERM:  # Ray's own handler, in force during init, exits with the signal number
            raise Terminated() from None
        raise WorkerPoolError(f"workers.address = {spec.address!r}: cannot connect to Ray ({exc})") from None
    except (ConnectionError, ValueError, RuntimeError) as exc:  # Ray exits when it gives up connecting
        raise WorkerPoolError(f"workers.address = {spec.address!r}: cannot connect to Ray ({exc})") from None


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Fail within `timeout_s` when nothing answers at a `host:port` or `ray://host:port` address ("auto" and
    other forms are left to Ray, which resolves them locally)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise WorkerPoolError(
            f"workers.address = {address!r}: nothing answers there within {timeout_s:g} s ({reason}); "
            "is the Ray cluster up?"
        ) from None


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


PROBE_INTERVAL_S = 0.5


@dataclass
class _Worker:
    actor: ray.actor.ActorHandle
    index: int
    in_flight: int = 0
    deaths: int = 0  # times it died; past the pool's max_restarts Ray will not bring it back
    death_counted: bool = False  # this outage's death is counted (its other in-flight calls fail with it)
    dead: bool = False
    failed_since: float | None = None  # set while the worker is down and being probed
    next_probe_at: float | None = None  # when to ask a down worker again (None: a probe is out)

    @property
    def usable(self) -> bool:
        return not self.dead and self.failed_since is None


@dataclass
class _Call:
    worker: _Worker
    batch: list[Task] = field(default_factory=list)
    probe: bool = False
    load: bool = False  # a `load` call (the windows), answered with the worker's ready() info


class WorkerPool:
    """Candidates in, (key, CandidateScore) out, in completion order."""

    def __init__(
        self,
        model: ModelSpec,
        windows: np.ndarray | Sequence[np.ndarray],
        spec: PoolSpec | None = None,
        *,
        loss_mask: np.ndarray | Sequence[np.ndarray | None] | None = None,
        worker_class=None,
    ):
        """`windows` [count, length], or a list of such window sets (each worker loads the model once for all of
        them; `self.spans` gives each set's range for `submit`). `loss_mask` [count, length - 1], or one per set:
        which predictions of each window count (None: all).
        `worker_class`: the actor class (ScoringWorker; bench/search_cost.py passes a synthetic one with the
        same constructor and `ready`/`score` methods to measure scheduling without a model). It is built with
        no windows; a class with a `load` method gets them from `load` (see ScoringWorker)."""
        spec = spec or PoolSpec()
        if spec.num_workers < 1:
            raise WorkerPoolError(f"workers.num_workers: must be at least 1, got {spec.num_workers}")
        ensure_ray(spec)
        self.spec = spec
        num_cpus, num_gpus = actor_resources(spec, ray.cluster_resources())
        # Held for the pool's lifetime: sent to every worker by `load`, and again to a restarted one.
        window_sets, loss_masks = as_window_sets(windows, loss_mask)
        self.spans = window_spans(window_sets)
        self.windows_ref = ray.put([np.ascontiguousarray(w, dtype=np.int64) for w in window_sets])
        self.loss_mask_ref = ray.put([None if m is None else np.ascontiguousarray(m, dtype=bool) for m in loss_masks])
        actor_class = ray.remote(worker_class or ScoringWorker).options(
            num_gpus=num_gpus,
            num_cpus=num_cpus,
            max_restarts=spec.max_restarts,
            max_task_retries=0,
        )
        count = workers_to_start(spec, num_cpus, num_gpus, ray.nodes())
        # no ObjectRef among the constructor arguments (see ScoringWorker): the windows follow by `load`
        self.workers = [_Worker(actor_class.remote(model, None), i) for i in range(count)]
        self._queue: deque[Task] = deque()  # packed into calls of batch_size when a worker has room
        self._calls: dict[ray.ObjectRef, _Call] = {}
        if callable(getattr(worker_class or ScoringWorker, "load", None)):
            for worker in self.workers:
                self._send_windows(worker)
        self.failures = 0
        self.started_at = time.monotonic()
        self.answered = False  # has any worker answered a call yet?
        self.start_warned = False

    def worker_info(self) -> list[dict]:
        """Each usable worker's pid, device and node (waits until every worker has loaded its model)."""
        return ray.get([w.actor.ready.remote() for w in self.workers if w.usable])

    @property
    def capacity(self) -> int:
        """Candidates the usable workers hold at once (each with `calls_per_worker` calls of `batch_size`): a
        steady-state search keeps this many out, so every worker always has its next call queued."""
        usable = sum(1 for w in self.workers if w.usable) or 1
        return usable * self.spec.calls_per_worker * max(1, self.spec.batch_size)

    def submit(
        self, candidates: Iterable[tuple[Key, RopeMethod]], windows: WindowRange | None = None, gradient: bool = False
    ) -> None:
        """Queue candidates, each to be scored on `windows` ([start, stop) of the pool's windows; None: all); with
        `gradient`, each result also carries d NLL / d factors per window (`CandidateScore.gradient`)."""
        self._queue.extend(Task(key, method, windows, gradient) for key, method in candidates)

    def as_completed(self) -> Iterator[tuple[Key, CandidateScore]]:
        """Results of everything submitted, as each batch finishes; returns when all are done."""
        while self._queue or any(not call.probe for call in self._calls.values()):  # submit() may add more
            self._dispatch()
            if all(w.dead for w in self.workers):
                raise WorkerPoolError(
                    f"worker pool: no worker left ({self.failures} worker failures); "
                    f"{len(self._queue)} candidates were not scored"
                )
            if not self._calls:  # every worker is down and waiting for its next probe
                time.sleep(PROBE_INTERVAL_S)
                continue
            ready, _ = ray.wait(list(self._calls), num_returns=1, timeout=PROBE_INTERVAL_S)
            if ready:
                yield from self._collect(ready[0])
            else:
                self._warn_if_never_started()

    def imap(self, candidates: Iterable[tuple[Key, RopeMethod]]) -> Iterator[tuple[Key, CandidateScore]]:
        """Score candidates on all windows; results in completion order."""
        self.submit(candidates)
        return self.as_completed()

    def shutdown(self) -> None:
        for worker in self.workers:
            ray.kill(worker.actor, no_restart=True)
        self.workers, self._calls = [], {}

    def _send_windows(self, worker: _Worker, *, probe: bool = False) -> None:
        """The windows to one worker (`load`), ahead of any batch sent to it (Ray runs one caller's calls to an
        actor in order). Counted in flight like a batch, so a worker that dies loading is noticed like one
        that dies scoring; as a probe, it brings a restarted worker back once it answers."""
        call = _Call(worker, probe=probe, load=True)
        self._calls[worker.actor.load.remote(self.windows_ref, self.loss_mask_ref)] = call
        if not probe:
            worker.in_flight += 1

    def _dispatch(self) -> None:
        now = time.monotonic()
        for worker in self.workers:
            if worker.failed_since is not None and not worker.dead:
                self._probe_if_due(worker, now)
            while worker.usable and self._queue and worker.in_flight < self.spec.calls_per_worker:
                size = min(max(1, self.spec.batch_size), len(self._queue))
                batch = [self._queue.popleft() for _ in range(size)]
                self._calls[worker.actor.score.remote(batch)] = _Call(worker, batch)
                worker.in_flight += 1

    def _warn_if_never_started(self) -> None:
        """Placement is counted from the nodes' totals; on a shared cluster the resources may be taken, and Ray
        then holds the actors pending without a word. Say so once instead of waiting in silence."""
        waited = time.monotonic() - self.started_at
        if self.answered or self.start_warned or waited < self.spec.start_warning_s:
            return
        self.start_warned = True
        warnings.warn(
            f"worker pool: no worker has answered after {waited:.0f} s ({len(self.workers)} started); loading a "
            "large model takes a while, but if this goes on the cluster may have no free CPUs/GPUs for them "
            "(see `ray status`)",
            stacklevel=2,
        )

    def _probe_if_due(self, worker: _Worker, now: float) -> None:
        """A down worker: given up past `restart_timeout_s` (checked on every pass, not only on failures);
        otherwise asked `ready()` every PROBE_INTERVAL_S once its in-flight calls have all come back."""
        if now - worker.failed_since > self.spec.restart_timeout_s:
            worker.dead = True
            return
        if worker.in_flight or any(c.probe and c.worker is worker for c in self._calls.values()):
            return
        if worker.next_probe_at is None:
            worker.next_probe_at = now + PROBE_INTERVAL_S
        elif now >= worker.next_probe_at:
            self._calls[worker.actor.ready.remote()] = _Call(worker, probe=True)
            worker.next_probe_at = None

    def _collect(self, ref: ray.ObjectRef) -> list[tuple[Key, CandidateScore]]:
        call = self._calls.pop(ref)
        try:
            value = ray.get(ref)
        except RayActorError as exc:
            self._on_failure(call, died=not isinstance(exc, ActorUnavailableError))
            return []
        except RayTaskError as exc:  # the call itself raised: the same input would fail again, so stop now
            cause = exc.cause if isinstance(exc.cause, Exception) else exc
            if isinstance(cause, WindowsMissing):  # a restarted actor: not this input's fault
                self._on_windows_missing(call)
                return []
            if isinstance(cause, ModelLoadError):
                raise ModelLoadError(str(cause)) from None
            name = type(cause).__name__
            raise WorkerPoolError(f"worker {call.worker.index}: scoring failed: {name}: {one_line(cause)}") from None
        except RayError as exc:  # the object store or the cluster failed under the call: one line, not a traceback
            name = type(exc).__name__
            raise WorkerPoolError(f"worker {call.worker.index}: Ray failed: {name}: {one_line(exc)}") from None
        self.answered = True
        if call.probe:
            call.worker.failed_since = None  # it answered again: back in the pool
            call.worker.death_counted = False
            return []
        call.worker.in_flight -= 1
        return [] if call.load else value

    def _on_windows_missing(self, call: _Call) -> None:
        """A restarted actor answered without windows: a probe sends them (the worker stays down until that
        answers); a batch goes back to the queue, and the worker is probed like any other failed one."""
        if call.probe:
            self._send_windows(call.worker, probe=True)
        else:
            self._on_failure(call, died=False)

    def _on_failure(self, call: _Call, *, died: bool = True) -> None:
        """Re-queue lost work; probe the worker until Ray has restarted it or `restart_timeout_s` passes."""
        worker, now = call.worker, time.monotonic()
        if died and (call.probe or not worker.death_counted):  # in-flight calls of one death count once
            worker.deaths += 1
            worker.death_counted = True
        if not call.probe:
            worker.in_flight -= 1
            self._queue.extendleft(reversed(call.batch))  # lost work goes first, to whoever is free
            if worker.failed_since is None:
                self.failures += 1
                worker.failed_since = now
        if worker.deaths > self.spec.max_restarts or now - worker.failed_since > self.spec.restart_timeout_s:
            worker.dead = True
        worker.next_probe_at = None  # `_dispatch` schedules the next probe once nothing of it is in flight
