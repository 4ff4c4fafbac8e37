"""job.json: what a run was resolved to when it started (the model's RoPE shape, lengths, the windows' hash).

It is the one place that turns a run into a `LongRope` encoding (export), and what a resumed run checks its
freshly built windows against: a data file changed under a run would silently break its determinism.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_serializer

from longrope.encodings import LongRope
from longrope.encodings.rotary import rotary_dim_for
from longrope.search.config.job_config import digest
from longrope.search.optimizers.history_record import HistoryRecord
from longrope.search.run.run_store import RunDir, RunStoreError, first_error

JOB_FILE = "job.json"
# what a resume re-resolves and must find unchanged (None where the run had none: not checked)
PINNED_FIELDS = (
    "search_windows_hash",
    "seeds_hash",
    "original_length",
    "target_length",
    "head_dim",
    "rope_theta",
    "partial_rotary_factor",
    "factor",
    "long_factor",
    "attention_factor",
)


class WindowSource(BaseModel):
    """Where one search window was cut: its document, first token, and the document text's sha256 (UTF-8)."""

    model_config = ConfigDict(extra="forbid")

    document: str
    offset: int
    sha256: str


class WindowsShape(BaseModel):
    model_config = ConfigDict(extra="forbid")

    count: int
    tokens: int  # tokens per window: target_length + 1 (n + 1 tokens are read at n positions)
    documents: list[WindowSource] | None = None  # absent where windows are not cut from named documents

    @model_serializer(mode="wrap")
    def _without_absent_documents(self, handler):
        """A record without `documents` dumps (and so hashes) without the key, as it was written."""
        fields = handler(self)
        if fields.get("documents") is None:
            fields.pop("documents", None)
        return fields


# fields a job.json holds only when they apply (a model that ships RoPE scaling), so that a plain model's job.json
# has the fields, and the hash, that release 1.0 wrote
WRITTEN_WHEN_SET = ("serving_length", "serving_factors")


class RopeShape(BaseModel):
    """The model's RoPE shape and the run's lengths: everything a LongRoPE encoding needs besides its factors.

    The one place that turns factors into a `LongRope` for a run (search candidates, export, seeds from runs,
    compare), so no caller copies the model's shape field by field."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    original_length: int
    target_length: int
    rope_theta: float
    head_dim: int
    partial_rotary_factor: float
    # a model that ships RoPE scaling: the length it serves as shipped, and its scaling there as per-pair factors;
    # the export keeps the model as shipped up to that length (`deployed`)
    serving_length: int | None = None
    serving_factors: list[float] | None = None

    def deployed(self, method: LongRope) -> LongRope:
        """A searched candidate as it is exported: for a model that ships RoPE scaling, its short regime is the
        model's own scaling up to the length it serves (`serving_factors` below `serving_length`), so an export
        reads as the shipped model there, up to the candidate's attention factor, which transformers applies in
        both regimes; the long factors and attention factor are the candidate's. Unchanged for a plain model."""
        if self.serving_length is None or self.serving_factors is None or any(f != 1.0 for f in method.short_factor):
            return method  # a short-factor run's short factors are the searched ones
        return self.longrope(
            method.long_factor,
            short_factor=self.serving_factors,
            attention_factor=method.attention_factor,
            n_hat=method.n_hat,
            original_length=self.serving_length,
        )

    def longrope(
        self,
        factors,
        *,
        short_factor=None,
        attention_factor: float | None = None,
        n_hat: int = 0,
        original_length: int | None = None,
    ) -> LongRope:
        """LongRoPE with these long factors at the target length (`factor = target / original`), short factors
        all ones unless given, its short regime ending at the original length unless `original_length` says
        where (`deployed`: the length a model that ships scaling serves)."""
        return LongRope.from_factors(
            factors,
            short_factor=short_factor,
            head_dim=self.head_dim,
            original_length=original_length or self.original_length,
            target_length=self.target_length,
            rope_theta=self.rope_theta,
            partial_rotary_factor=self.partial_rotary_factor,
            attention_factor=attention_factor,
            n_hat=n_hat,
        )


class JobRecord(RopeShape):
    """job.json, beside config.json in the run directory: the run as resolved when it started."""

    model_dir: str
    search_windows_hash: str
    search_windows: WindowsShape
    corpus: dict[str, str] | None = None
    seeds_hash: str | None = None  # the seed factors as resolved (seed files and runs can change under a path)
    # a short-factor run (search.factor: short): the long factors and attention factor it kept beside the search
    factor: Literal["long", "short"] = "long"
    long_factor: list[float] | None = None
    attention_factor: float | None = None
    config_hash: str | None = None  # the run's config (config.json's config_hash)
    record_hash: str | None = None  # this record's own fields (`sealed`), so an edit by hand is seen

    def sealed(self) -> dict[str, Any]:
        """job.json as written: the fields and their hash, as config.json carries its config's hash. A reader
        that finds them apart (`read_job_record`) knows the file was edited after the run wrote it."""
        unset = {name for name in WRITTEN_WHEN_SET if getattr(self, name) is None}
        fields = self.model_dump(mode="json", exclude={"record_hash", *unset})
        return {**fields, "record_hash": digest(fields)}

    def candidate(self, record: HistoryRecord) -> LongRope:
        """A history record (a candidate of this run) as the encoding it was scored with: a short-factor run's
        records hold short factors, beside the long factors and attention factor job.json kept."""
        short = self.factor == "short"
        return self.longrope(
            self.long_factor if short else record.factors,
            short_factor=record.factors if short else None,
            attention_factor=record.attention_factor,
            n_hat=record.n_hat,
        )

    @property
    def pairs(self) -> int:
        """Rotary frequency pairs: rotary_dim / 2, with rotary_dim = int(head_dim x partial_rotary_factor), as
        transformers and vLLM truncate it."""
        return rotary_dim_for(self.head_dim, self.partial_rotary_factor) // 2


def read_job_record(run_dir: RunDir) -> JobRecord:
    """job.json, whole (every field valid) and as the run wrote it: its record_hash matches its fields as stored
    (never as today's model re-dumps them, so a field added to JobRecord later leaves an earlier release's record
    hash as it was)."""
    data = run_dir.read_json(JOB_FILE)
    try:
        record = JobRecord.model_validate(data)
    except ValidationError as exc:
        raise RunStoreError(f"{run_dir.file(JOB_FILE)}: {first_error(exc)}") from exc
    if record.record_hash is not None and record.record_hash != digest(
        {name: value for name, value in data.items() if name != "record_hash"}
    ):
        raise RunStoreError(
            f"{run_dir.file(JOB_FILE)}: record_hash does not match its fields (edited by hand?); job.json records "
            "what the run was resolved to when it started and cannot be changed after"
        )
    return record


def check_job_record(run_dir: RunDir, stored: JobRecord | None, record: JobRecord) -> bool:
    """On resume: True when job.json must still be written (a kill right after config.json); an error when the
    stored record (as `read_run` read it) differs from what this resume resolved (the model or the data changed
    under the run)."""
    if stored is None:
        return True
    for name in PINNED_FIELDS:
        if getattr(stored, name) is not None and getattr(stored, name) != getattr(record, name):
            raise RunStoreError(
                f"{run_dir.file(JOB_FILE)}: {name} was {getattr(stored, name)!r} when the run started, is now "
                f"{getattr(record, name)!r} (the model, the data or a seed file changed); start a new run instead"
            )
    return False
