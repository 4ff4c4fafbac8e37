"""The job config: one strict pydantic model of its sections, with the checks across them and its hash.

Bad input stops here, before any model is loaded, with one line per problem naming the field and the value
(`loading.py` reads the YAML and the `--set` overrides into it)."""

from __future__ import annotations

import hashlib
import json

from pydantic import Field, field_validator, model_validator

from longrope.search.config.inputs import DataConfig, ModelConfig
from longrope.search.config.search_section import SearchConfig
from longrope.search.config.strict import MAX_LENGTH, Strict, checked_os_path
from longrope.search.config.workers_section import WorkersConfig
from longrope.workers.path_limits import RUN_DIR_ROOM

LATER_SEARCH_FIELDS = (
    "gradient",
    "optimizer",
    "schedule",
    "racing",
    "cmaes",
    "space",
    "critical_dim",
    "length_scale",
    "factor",
    "long_factors",
    "stages",
)
LATER_DATA_FIELDS = ("objective",)


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
        gradient, windows = self.search.gradient, self.data.search_windows * len(self.data.objective_weights())
        if self.search.descends and gradient.holdout_windows >= windows:
            raise ValueError(
                f"search.gradient.holdout_windows: must leave the gradient at least one of the {windows} search "
                f"windows, got {gradient.holdout_windows}"
            )
        if self.search.descends and (gradient.windows_per_step or 0) > windows - gradient.holdout_windows:
            raise ValueError(
                f"search.gradient.windows_per_step: at most the {windows - gradient.holdout_windows} gradient windows "
                f"(search windows less holdout_windows), got {gradient.windows_per_step}"
            )
        racing = self.search.racing
        if racing.enabled and racing.min_windows >= self.data.search_windows:
            raise ValueError(
                f"search.racing.min_windows: must be < data.search_windows ({self.data.search_windows}) for racing "
                f"to stop anything, got {racing.min_windows}"
            )
        return self

    def hash(self) -> str:
        """Identity of a run: everything that changes its result (not where it is written, who scores it, or
        whether TensorBoard watches it: `search.tensorboard`).

        Search fields added after the first release (LATER_SEARCH_FIELDS) count only when they differ from their
        defaults, so a run directory written before them still matches its config and can be resumed."""
        unrelated = {"output_dir": True, "workers": True, "search": {"tensorboard"}}
        identity = self.model_dump(mode="json", exclude=unrelated)
        for section, names, defaults in (
            ("search", LATER_SEARCH_FIELDS, SearchConfig().model_dump(mode="json")),
            ("data", LATER_DATA_FIELDS, DataConfig().model_dump(mode="json")),
        ):
            for name in names:
                if identity[section][name] == defaults[name]:
                    del identity[section][name]
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def check_lengths_message(original_length: int, target_length: int) -> str:
    return f"target_length: must be greater than original_length ({original_length}), got {target_length}"
