"""The job config: one strict pydantic model of its sections, with the checks across them and its hash.

Bad input stops here, before any model is loaded, with one line per problem naming the field and the value
(`loading.py` reads the YAML and the `--set` overrides into it)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import Field, field_validator, model_validator

from longrope.search.config.inputs import DataConfig, ModelConfig
from longrope.search.config.search_section import SearchConfig
from longrope.search.config.strict import MAX_LENGTH, Strict, checked_os_path
from longrope.search.config.workers_section import WorkersConfig
from longrope.workers.path_limits import RUN_DIR_ROOM

# what never changes a run's result: where it is written, who scores it, whether TensorBoard watches it. Frozen for
# a run-directory format: adding to it would change every stored hash of that format
UNRELATED_FIELDS = {"output_dir": True, "workers": True, "search": {"tensorboard": True}}


class JobConfig(Strict):
    name: str = Field(default="longrope-search", description="the job's name, in logs and status")
    model: ModelConfig = Field(default=ModelConfig(), description="section: the model and how workers load it")
    data: DataConfig = Field(default=DataConfig(), description="section: documents, tokenizer, windows, objective")
    original_length: int | None = Field(
        default=None, ge=2, le=MAX_LENGTH, description="the length the model was trained at; null: read from its config"
    )
    target_length: int = Field(ge=2, le=MAX_LENGTH, description="the length the factors are searched for")
    search: SearchConfig = Field(default=SearchConfig(), description="section: the search")
    workers: WorkersConfig = Field(default=WorkersConfig(), description="section: where candidates are scored")
    output_dir: str = Field(
        default="runs/job",
        min_length=1,
        description="the run directory: config.json, job.json, history.jsonl, state.json, the windows cache",
    )

    @field_validator("output_dir")
    @classmethod
    def _a_path(cls, value: str) -> str:
        if not value.strip() or "\x00" in value:
            raise ValueError("must name a directory (not blank, no NUL character)")
        return checked_os_path(value, room=RUN_DIR_ROOM)

    @model_validator(mode="after")
    def _lengths(self) -> JobConfig:
        if self.original_length is not None and self.target_length <= self.original_length:
            raise ValueError(check_lengths_message(self.original_length, self.target_length))
        n_hat = self.search.n_hat
        if n_hat.enabled and max(n_hat.choices) >= self.target_length:
            raise ValueError(
                f"search.n_hat.choices: every choice must be < target_length ({self.target_length}), "
                f"got {max(n_hat.choices)}"
            )
        if self.search.factor == "short" and "tail" in self.data.objective_weights():
            raise ValueError(
                "data.objective: 'tail' counts positions past original_length, and a short-factor search reads "
                "windows of original_length tokens"
            )
        stages = self.search.stages
        if stages and (stages[-1] >= self.target_length or stages[0] <= (self.original_length or 0)):
            bad = stages[-1] if stages[-1] >= self.target_length else stages[0]
            raise ValueError(
                f"search.stages: each stage length must lie between original_length ({self.original_length}) and "
                f"target_length ({self.target_length}), got {bad}"
            )
        racing = self.search.racing
        if racing.enabled and racing.min_windows >= self.data.search_windows:
            raise ValueError(
                f"search.racing.min_windows: must be < data.search_windows ({self.data.search_windows}) for racing "
                f"to stop anything, got {racing.min_windows}"
            )
        return self

    def hash(self) -> str:
        """The identity hash a run started now from this config writes into config.json (`identity_hash` of its JSON
        dump). An existing run keeps the hash it was written with (`RunDir.config_hash`), which differs where this
        code has added fields since."""
        return digest(self.identity())

    def identity(self) -> dict:
        """Everything that changes a run's result, as JSON: what a resume and a new run compare against the
        stored config, both read by today's code."""
        return identity_fields(self.model_dump(mode="json"))

    def first_difference(self, other: JobConfig) -> str | None:
        """The first field (dotted, in field order) where two configs' identities differ; None when they agree."""
        return _first_difference(self.identity(), other.identity(), "")


def identity_hash(config: dict[str, Any]) -> str:
    """A run's identity: sha256 (first 16 hex digits) of its config as JSON with sorted keys, less UNRELATED_FIELDS.

    Taken over a config.json's config as written, never as today's code re-reads it, so a field added to the model
    later (with a default) or a default changed later never changes an older run's hash."""
    return digest(identity_fields(config))


def identity_fields(config: dict[str, Any]) -> dict[str, Any]:
    """A config's JSON less UNRELATED_FIELDS (a copy, sections copied too)."""
    identity = {name: dict(value) if isinstance(value, dict) else value for name, value in config.items()}
    for name, part in UNRELATED_FIELDS.items():
        if part is True:
            identity.pop(name, None)
        elif isinstance(identity.get(name), dict):
            for sub in part:
                identity[name].pop(sub, None)
    return identity


def _first_difference(first: Any, second: Any, where: str) -> str | None:
    if isinstance(first, dict) and isinstance(second, dict):
        for key in [*first, *(k for k in second if k not in first)]:
            found = _first_difference(first.get(key), second.get(key), f"{where}.{key}" if where else key)
            if found:
                return found
        return None
    return None if first == second else where


def digest(fields: dict[str, Any] | list) -> str:
    """sha256 (first 16 hex digits) of JSON fields with sorted keys: the run directory's one hash."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def check_lengths_message(original_length: int, target_length: int) -> str:
    return f"target_length: must be greater than original_length ({original_length}), got {target_length}"
