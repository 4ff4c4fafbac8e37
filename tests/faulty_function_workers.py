"""Ray workers that score the known problem (bench/known_problem.py, no model) and fail on purpose, so a whole search
runs through the real worker pool in seconds and a test sees what one bad task, one lost actor or one bad GPU costs.

`FunctionWorker` has ScoringWorker's shape (built with the model spec and no windows; `ready`, `score`) and scores
`window_nll` on each task's windows, exactly as the in-process FunctionEvaluator of tests/search_helpers.py does:
a run through the pool and one without it have the same scores. What it does wrong is set by the file `fault` in
the folder `ModelSpec.model_dir` (its first word, then its arguments):
- `none`: nothing;
- `raise N`: the N-th `score` call (counted over every actor) raises RuntimeError, as a CUDA OOM does;
- `die N`: the N-th `score` call exits the process at once (an actor killed mid-task);
- `broken`: the first actor ever started raises on every call (a bad GPU); an actor started after it is fine;
- `slow S`: every call takes S seconds more (a call is still out when the test pulls its node away);
- `poison M`: every call holding a candidate whose key's hash is 0 modulo M raises, on any actor (the candidate's
  own fault: `is_poisoned` says which).
Each call is logged to `calls` in the same folder, under a lock, so counts hold across actors and restarts. Ray
ships this module and known_problem to its workers by value: they cannot import tests/ or bench/."""

from __future__ import annotations

import fcntl
import hashlib
import os
import sys
import time
from pathlib import Path

import known_problem
import numpy as np
import ray

from longrope.workers.scorer import CandidateScore
from longrope.workers.specs import ModelSpec

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(known_problem)


def fault_folder(folder: Path, fault: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "fault").write_text(fault)
    return folder


def function_model(folder: Path, windows: int = 1) -> ModelSpec:
    """The spec a FunctionWorker reads its fault folder and the search's window count from."""
    return ModelSpec(model_dir=str(folder), config_overrides={"windows": windows})


def is_poisoned(key: str, modulus: int) -> bool:
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % modulus == 0


def score_calls(folder: Path) -> int:
    path = folder / "calls"
    return len(path.read_text().split()) if path.exists() else 0


class FunctionWorker:
    def __init__(self, spec, windows, loss_mask=None):
        self.folder = Path(spec.model_dir)
        self.windows = int(spec.config_overrides.get("windows", 1))
        self.fault = (self.folder / "fault").read_text().split()
        self.broken = False
        if self.fault[0] == "broken":  # the first actor to claim the marker is the bad one; later ones are not
            try:
                os.close(os.open(self.folder / "broken-claimed", os.O_CREAT | os.O_EXCL))
                self.broken = True
            except FileExistsError:
                pass

    def ready(self) -> dict:
        return {"pid": os.getpid(), "device": "cpu", "node": ray.get_runtime_context().get_node_id()}

    def score(self, batch):
        number = self._log_call()
        kind, args = self.fault[0], [int(a) for a in self.fault[1:] if a.isdigit()]
        if self.broken or (kind == "raise" and number == args[0]):
            raise RuntimeError(f"CUDA out of memory (simulated, call {number})")
        if kind == "slow":
            time.sleep(float(self.fault[1]))
        if kind == "die" and number == args[0]:
            os._exit(1)
        if kind == "poison" and any(is_poisoned(task[0][0], args[0]) for task in batch):
            raise ValueError("a candidate this worker cannot score (simulated)")
        return [(task[0], self._score(task[1], task[2])) for task in batch]

    def _log_call(self) -> int:
        """This call's number over every actor: the log is locked from the append to the count, or two actors
        appending at once would both read the later count, and a fault set for the earlier number never fires."""
        with open(self.folder / "calls", "a") as log:
            fcntl.flock(log, fcntl.LOCK_EX)
            log.write(f"{os.getpid()}\n")
            log.flush()
            return score_calls(self.folder)

    def _score(self, method, windows) -> CandidateScore:
        start, stop = windows or (0, self.windows)
        factors = np.asarray(method.long_factor)
        nll = tuple(known_problem.window_nll(factors, j, self.windows) for j in range(start, stop))
        return CandidateScore(nll=nll, tokens=(1,) * len(nll))
