"""The worker pool on Ray: one actor per worker slot, each with one model copy, fed candidates as they free up.

Results come back as they finish (no barrier per batch), so a slow worker never idles the others; each
worker keeps `calls_per_worker` batches queued so it never waits for the coordinator between batches. A
worker that dies loses only its in-flight batches, which go back to the front of the queue for the others;
Ray restarts the actor where it can (`max_restarts`), and the pool sends it the windows again and takes it back
once it answers. The caller gets every result exactly once.

A task that raises (a CUDA OOM on a smaller card, a NaN check, a broken driver) costs only that task: it is sent
again, alone, to another worker where one is left, up to `retries` times, and then given up: with
`record_failures` the pool yields a `TaskFailure` for it and goes on (the search records it as failed), else it
raises. Errors are not sorted into the candidate's and the worker's by their type: a task that fails on several
workers is taken to be at fault, and a worker whose tasks fail `retire_after_failures` times in a row (none
answered between) is taken to be broken, killed and replaced by a fresh one.

The pool fails fast, with the cause: a worker that cannot load its model reports that exception at once (it is
not restarted into the same failure); a worker that has died more often than Ray restarts it is given up at
once; when no worker is left, the pool raises one `WorkerPoolError`. It starts only as many workers as the
cluster can place, so batches never wait on an actor that will never be scheduled.

This module is the queue and the failure handling. The actor it starts is scoring_worker.py, starting or joining
Ray is ray_start.py, and how large each actor is and how many fit is placement.py.
"""

from __future__ import annotations

import math
import time
import warnings
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field

import numpy as np
import ray
from ray.exceptions import ActorUnavailableError, RayActorError, RayError, RayTaskError

from longrope.encodings import RopeMethod
from longrope.workers.busy_clock import BusyClock
from longrope.workers.errors import ModelLoadError, WorkerPoolError, one_line
from longrope.workers.placement import actor_options, actor_resources, workers_to_start
from longrope.workers.ray_start import ensure_ray
from longrope.workers.scorer import CandidateScore
from longrope.workers.scoring_worker import (
    Key,
    ScoringWorker,
    Task,
    WindowRange,
    WindowsMissing,
    as_window_sets,
    window_spans,
)
from longrope.workers.specs import ModelSpec, PoolSpec
from longrope.workers.task_failure import TaskFailure

PROBE_INTERVAL_S = 0.5
SHUTDOWN_DRAIN_S = 5.0  # at most this long collecting killed workers' calls (`shutdown`)


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
    failed_in_a_row: int = 0  # calls that raised since its last answer: past the pool's limit it is replaced

    @property
    def usable(self) -> bool:
        return not self.dead and self.failed_since is None


@dataclass
class _Call:
    worker: _Worker
    batch: list[Task] = field(default_factory=list)
    probe: bool = False
    load: bool = False  # a `load` call (the windows), answered with the worker's ready() info
    retry: _Retry | None = None  # a task sent again after it raised (alone in its call)


@dataclass
class _Retry:
    """A task that raised: the workers it failed on (a retry goes to another where one is left), how often, and
    the last error on one line."""

    task: Task
    failed_on: set[int] = field(default_factory=set)
    attempts: int = 0
    error: str = ""


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
        record_failures: bool = False,
    ):
        """`windows` [count, length], or a list of such window sets (each worker loads the model once for all of
        them; `self.spans` gives each set's range for `submit`). `loss_mask` [count, length - 1], or one per set:
        which predictions of each window count (None: all).
        `worker_class`: the actor class (ScoringWorker; bench/search_cost.py passes a synthetic one with the
        same constructor and `ready`/`score` methods to measure scheduling without a model). It is built with
        no windows; a class with a `load` method gets them from `load` (see ScoringWorker).
        `record_failures`: a task that raised on `spec.retries + 1` tries is yielded as a `TaskFailure` (the
        search records it and goes on); otherwise it raises `WorkerPoolError` (compare: a table needs every row)."""
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
        self.model, self.record_failures = model, record_failures
        self._actor_class = ray.remote(worker_class or ScoringWorker).options(**actor_options(spec, num_cpus, num_gpus))
        self._loads_windows = callable(getattr(worker_class or ScoringWorker, "load", None))
        self.workers: list[_Worker] = []
        self._queue: deque[Task] = deque()  # packed into calls of batch_size when a worker has room
        self._retries: deque[_Retry] = deque()  # tasks that raised, each sent alone to the next free worker
        self._calls: dict[ray.ObjectRef, _Call] = {}
        for _ in range(workers_to_start(spec, num_cpus, num_gpus, ray.nodes())):
            self._start_worker()
        self.retired = 0  # workers replaced after failing `retire_after_failures` tasks in a row
        self.retried = 0  # tasks sent again after they raised
        self.failures = 0
        self.width = len(self.workers)  # workers started: what a search cuts a generation's windows over
        self.busy = BusyClock(self.width)
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
        while self._queue or self._retries or any(not call.probe for call in self._calls.values()):  # submit() adds
            self._dispatch()
            if all(w.dead for w in self.workers):
                # queued, and still out with the dead workers (their calls never come back as results)
                out = sum(len(call.batch) for call in self._calls.values())
                unscored = len(self._queue) + len(self._retries) + out
                raise WorkerPoolError(
                    f"worker pool: no worker left ({self.failures} worker failures); "
                    f"{unscored} candidates were not scored"
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
        """Kill the workers, then collect what their outstanding calls became. A call that failed (the same
        error as the one that stopped the run, on a second batch) and was never fetched makes Ray log an
        "Unhandled error" with the worker's traceback when its ref is dropped: after the run's one-line error,
        the user would get the traceback it replaced. Killed workers' calls end at once, so the wait is short."""
        for worker in self.workers:
            ray.kill(worker.actor, no_restart=True)
        pending = list(self._calls)
        self.workers, self._calls = [], {}
        if pending:
            ready, _ = ray.wait(pending, num_returns=len(pending), timeout=SHUTDOWN_DRAIN_S)
            for ref in ready:
                with suppress(RayError):  # the run's error was raised already; this one is its echo
                    ray.get(ref)

    def _start_worker(self) -> _Worker:
        """A new actor (the pool's next index), sent the windows first where its class loads them by `load`."""
        # no ObjectRef among the constructor arguments (see ScoringWorker): the windows follow by `load`
        worker = _Worker(self._actor_class.remote(self.model, None), len(self.workers))
        self.workers.append(worker)
        if self._loads_windows:
            self._send_windows(worker)
        return worker

    def _send_windows(self, worker: _Worker, *, probe: bool = False) -> None:
        """The windows to one worker (`load`), ahead of any batch sent to it (Ray runs one caller's calls to an
        actor in order). Counted in flight like a batch, so a worker that dies loading is noticed like one
        that dies scoring; as a probe, it brings a restarted worker back once it answers."""
        call = _Call(worker, probe=probe, load=True)
        self._calls[worker.actor.load.remote(self.windows_ref, self.loss_mask_ref)] = call
        if not probe:
            worker.in_flight += 1

    def _dispatch(self) -> None:
        """Calls to the workers with room, one call a worker a round: every free worker gets its first call before
        any gets its second, and a second is queued on a busy worker only while the queue holds one for every
        worker (else what is left goes to the first worker that frees up). A call takes `batch_size` tasks only
        while the queue can fill every free call slot so; a shorter queue is shared out evenly over the slots, at
        ceil(queued / free slots) tasks a call (one, for a descent step's ranges): 8 ranges on 8 idle workers are
        8 calls, not two full batches on two of them."""
        now = time.monotonic()
        for worker in self.workers:
            if worker.failed_since is not None and not worker.dead:
                self._probe_if_due(worker, now)
        usable = [w for w in self.workers if w.usable]
        slots = sum(self.spec.calls_per_worker - w.in_flight for w in usable)
        size = max(1, min(self.spec.batch_size, math.ceil(len(self._queue) / max(1, slots))))
        for level in range(self.spec.calls_per_worker):
            queued_ahead = level == 0 or len(self._queue) >= len(usable)  # else the rest waits for the first free
            for worker in [w for w in usable if w.in_flight <= level]:
                retry = self._retry_for(worker)
                if retry is not None:
                    self._send(worker, [retry.task], retry)
                elif self._queue and queued_ahead:
                    self._send(worker, [self._queue.popleft() for _ in range(min(size, len(self._queue)))])
        self.busy.update(self._scoring_workers(), now)

    def _send(self, worker: _Worker, batch: list[Task], retry: _Retry | None = None) -> None:
        self._calls[worker.actor.score.remote(batch)] = _Call(worker, batch, retry=retry)
        worker.in_flight += 1

    def _scoring_workers(self) -> set[int]:
        """The workers with a scoring call out (not a load or a probe): busy, as `busy` counts it."""
        return {call.worker.index for call in self._calls.values() if not (call.probe or call.load)}

    def _retry_for(self, worker: _Worker) -> _Retry | None:
        """The first waiting retry this worker may take: one that has not failed on it, or one that has failed on
        every worker still in the pool (a one-worker pool retries where it can)."""
        live = {w.index for w in self.workers if not w.dead}
        for retry in self._retries:
            if worker.index not in retry.failed_on or live <= retry.failed_on:
                self._retries.remove(retry)
                return retry
        return None

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
        self.busy.update(self._scoring_workers(), time.monotonic())
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
                raise ModelLoadError(str(cause)) from exc
            if call.probe or call.load:  # not a task: no other worker would fare differently
                name = type(cause).__name__
                raise WorkerPoolError(f"worker {call.worker.index}: loading failed: {name}: {one_line(cause)}") from exc
            return self._on_task_error(call, f"{type(cause).__name__}: {one_line(cause)}")
        except RayError as exc:  # the object store or the cluster failed under the call: one line, not a traceback
            name = type(exc).__name__
            raise WorkerPoolError(f"worker {call.worker.index}: Ray failed: {name}: {one_line(exc)}") from exc
        self.answered = True
        if call.probe:
            call.worker.failed_since = None  # it answered again: back in the pool
            call.worker.death_counted = False
            return []
        call.worker.in_flight -= 1
        if not call.load:
            call.worker.failed_in_a_row = 0
        return [] if call.load else value

    def _on_task_error(self, call: _Call, error: str) -> list[tuple[Key, TaskFailure]]:
        """A call that raised: each of its tasks is retried alone (so a task at fault cannot take its batch-mates
        down with it) until it has failed `retries + 1` times, then given up (`TaskFailure`, or raised); the
        worker is replaced once its calls have raised `retire_after_failures` times in a row."""
        worker = call.worker
        worker.in_flight -= 1
        worker.failed_in_a_row += 1
        given_up = []
        for retry in [call.retry] if call.retry else [_Retry(task) for task in call.batch]:
            retry.failed_on.add(worker.index)
            retry.attempts += 1
            retry.error = error
            if retry.attempts <= self.spec.retries:
                self._retries.append(retry)
                self.retried += 1
            elif self.record_failures:
                given_up.append((retry.task.key, TaskFailure(error, retry.attempts)))
            else:
                raise WorkerPoolError(f"worker {worker.index}: scoring failed {retry.attempts} times: {error}")
        if worker.failed_in_a_row >= self.spec.retire_after_failures and not worker.dead:
            self._retire(worker)
        return given_up

    def _retire(self, worker: _Worker) -> None:
        """A worker that keeps failing (a bad GPU, a driver in a broken state): killed for good and replaced by a
        fresh actor, which Ray may place elsewhere. Its calls still out fail as a dead worker's do and go back to
        the queue."""
        worker.dead = True
        ray.kill(worker.actor, no_restart=True)
        self.retired += 1
        self._start_worker()

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
            if call.retry:
                self._retries.appendleft(call.retry)  # lost with the worker, not failed: its count stays
            else:
                self._queue.extendleft(reversed(call.batch))  # lost work goes first, to whoever is free
            if worker.failed_since is None:
                self.failures += 1
                worker.failed_since = now
        if worker.deaths > self.spec.max_restarts or now - worker.failed_since > self.spec.restart_timeout_s:
            worker.dead = True
        worker.next_probe_at = None  # `_dispatch` schedules the next probe once nothing of it is in flight
