"""A worker that fails on purpose, for the worker pool's failure handling on a real local Ray.

`ScriptedWorker` has ScoringWorker's shape (built with the model spec and no windows; `ready`, `score`), and its
n-th `score` call does what line n of `script` in the folder `ModelSpec.model_dir` names:
- `ok`: each candidate scored, its NLL the number of the call (so a test sees which call scored what);
- `unavailable`: raises ActorUnavailableError, what Ray raises for an actor it cannot reach for a moment;
- `die`: the process exits at once, as a worker killed by the OOM killer or a lost node;
- `sleep S`: waits S seconds, then scores (a worker slow to answer).
Past the script's end every call is `ok`. Each call is appended to `calls` in the same folder, so the count holds
across a restarted actor and the test reads what the pool asked for. Ray ships this module to its workers by
value: they cannot import tests/."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import ray
from ray.exceptions import ActorUnavailableError

from longrope.workers.scorer import CandidateScore

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def write_script(folder: Path, *actions: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "script").write_text("".join(f"{action}\n" for action in actions))
    return folder


def calls_made(folder: Path) -> list[str]:
    path = folder / "calls"
    return path.read_text().split() if path.exists() else []


class ScriptedWorker:
    def __init__(self, spec, windows, loss_mask=None):
        self.folder = Path(spec.model_dir)

    def ready(self) -> dict:
        self._record("ready")
        return {"pid": os.getpid(), "device": "cpu"}

    def score(self, batch):
        number = self._record("score")
        script = (self.folder / "script").read_text().splitlines()
        action = script[number - 1] if number <= len(script) else "ok"
        if action == "unavailable":
            raise ActorUnavailableError("unreachable for a moment", None)
        if action == "die":
            os._exit(1)
        if action.startswith("sleep "):
            time.sleep(float(action.split()[1]))
        return [(key, CandidateScore(nll=(float(number),), tokens=(1,))) for key, *_ in batch]

    def _record(self, call: str) -> int:
        """Append the call to the log; returns how many `score` calls there have been, this one included."""
        with open(self.folder / "calls", "a") as log:
            log.write(f"{call}\n")
        return calls_made(self.folder).count("score")


class SleepingWorker:
    """Sleeps `sleep_s` (the number in the file `sleep` of its folder) per task and scores each task as its own pid,
    so a test sees which worker scored what and how long each held its calls."""

    def __init__(self, spec, windows, loss_mask=None):
        self.sleep_s = float((Path(spec.model_dir) / "sleep").read_text())

    def ready(self) -> dict:
        return {"pid": os.getpid(), "device": "cpu"}

    def score(self, batch):
        time.sleep(self.sleep_s * len(batch))
        return [(key, CandidateScore(nll=(float(os.getpid()),), tokens=(1,))) for key, *_ in batch]
