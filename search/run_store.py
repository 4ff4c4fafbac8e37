"""The run directory: everything a search needs to be watched, resumed and exported, as plain JSON.

- config.json: the resolved job config and its hash (a run directory never holds two configs);
- state.json: the optimizer's whole state (population, scores, generator), written atomically after every
  generation, so a killed coordinator resumes exactly where the last generation ended;
- history.jsonl: every scored candidate with its per-window NLL, appended as results arrive, so a crash in the
  middle of a generation loses no evaluation (a resumed run takes those scores instead of recomputing them);
- best.json: the best candidate so far.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from longrope.search.job_config import JobConfig

CONFIG, STATE, HISTORY, BEST = "config.json", "state.json", "history.jsonl", "best.json"


class RunStoreError(ValueError):
    """A run directory is missing, holds another config, or has a damaged file."""


def write_json_atomic(path: Path, data: Any) -> None:
    """Write to a temp file in the same folder, fsync, then rename over: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
        json.dump(data, tmp, indent=1)
        tmp.flush()
        os.fsync(tmp.fileno())
    os.replace(tmp.name, path)


def seed_perplexities(history: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """Perplexity of each seed method (pi, ntk, yarn, ...) as scored in a run's history."""
    return {r["seed"]: r["perplexity"] for r in history.values() if r.get("seed")}


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def file(self, name: str) -> Path:
        return self.path / name

    # ---- config ----

    def create(self, config: JobConfig) -> None:
        """Start a new run here; refuses a directory that already holds a run."""
        self.check_new(config)
        write_json_atomic(self.file(CONFIG), {"config_hash": config.hash(), "config": config.model_dump(mode="json")})

    def check_new(self, config: JobConfig) -> None:
        """Refuse, without writing anything, a directory that already holds a run."""
        if self.file(CONFIG).exists():
            stored = self.read_config()
            if stored.hash() != config.hash():
                raise RunStoreError(
                    f"output_dir {str(self.path)!r} holds a run of another config (hash {stored.hash()}, this one "
                    f"{config.hash()}); choose another output_dir"
                )
            raise RunStoreError(f"output_dir {str(self.path)!r} already holds this run; continue it with --resume")

    def read_config(self) -> JobConfig:
        data = self.read_json(CONFIG)
        try:
            config = JobConfig.model_validate(data["config"])
        except (KeyError, TypeError, ValueError) as exc:
            raise RunStoreError(f"{self.file(CONFIG)}: not a run config ({str(exc).splitlines()[0]})") from None
        if data.get("config_hash") != config.hash():
            raise RunStoreError(f"{self.file(CONFIG)}: config_hash does not match its config (edited by hand?)")
        return config

    def check_matches(self, config: JobConfig) -> None:
        stored = self.read_config()
        if stored.hash() != config.hash():
            raise RunStoreError(
                f"output_dir {str(self.path)!r} holds a run of another config (hash {stored.hash()}, "
                f"given {config.hash()})"
            )

    # ---- state, history, best ----

    def write_state(self, state: dict[str, Any]) -> None:
        write_json_atomic(self.file(STATE), state)

    def read_state(self) -> dict[str, Any] | None:
        if not self.file(STATE).exists():
            return None
        state = self.read_json(STATE)
        missing = {"evolution", "generation_seconds"} - set(state) if isinstance(state, dict) else {"evolution"}
        if missing:
            raise RunStoreError(f"{self.file(STATE)}: corrupted (missing {sorted(missing)})")
        return state

    def append_history(self, record: dict[str, Any]) -> None:
        with self.file(HISTORY).open("a") as history:
            history.write(json.dumps(record) + "\n")
            history.flush()
            os.fsync(history.fileno())

    def read_history(self) -> dict[str, dict[str, Any]]:
        """Scored candidates by key; a last line cut short by a crash is ignored, any other bad line is an error."""
        if not self.file(HISTORY).exists():
            return {}
        records: dict[str, dict[str, Any]] = {}
        lines = self.file(HISTORY).read_text().splitlines()
        for number, line in enumerate(lines, start=1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if number == len(lines):
                    break
                raise RunStoreError(f"{self.file(HISTORY)}:{number}: corrupted line") from None
            records[record["key"]] = record
        return records

    def write_best(self, record: dict[str, Any]) -> None:
        write_json_atomic(self.file(BEST), record)

    def read_best(self) -> dict[str, Any]:
        return self.read_json(BEST)

    def read_json(self, name: str) -> Any:
        path = self.file(name)
        if not path.is_file():
            raise RunStoreError(f"{path}: missing (is {str(self.path)!r} a run directory?)")
        try:
            return json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RunStoreError(f"{path}: corrupted ({exc})") from None
