"""The Ray actor that scores: one model copy, the job's windows, batches of candidates in, NLLs per window out.

`WorkerPool` (pool.py) starts one per worker slot and feeds it; nothing here knows about other workers,
restarts or the queue. A task names its candidate, the windows to score it on and whether its gradient is
wanted; the actor answers with the scorer's `CandidateScore` (workers/scorer.py).
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Sequence
from typing import NamedTuple

import numpy as np
import ray

from longrope.encodings import RopeMethod
from longrope.workers.errors import ModelLoadError, one_line
from longrope.workers.scorer import CandidateScore
from longrope.workers.specs import ModelSpec

Key = Hashable  # the caller's name for a candidate, handed back with its score
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
        import torch  # torch: in the actor process, so the driver importing this module pays nothing

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
            gpus=spec.gpus,
        )

    def _load_windows(self, windows: list[np.ndarray], loss_masks: list[np.ndarray | None]) -> None:
        import torch  # torch: in the actor process, so the driver importing this module pays nothing

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
                checkpoints=spec.checkpoints,
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
