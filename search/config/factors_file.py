"""The factors JSON file: what `longrope export` writes and `longrope encodings factors` prints.

Its `rope_parameters` block is a transformers `rope_type: "longrope"` block that drops into a model's
`config.json` as it is (with `max_position_embeddings` beside it); `provenance` says where it came from.
"""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from longrope.encodings import LongRope, RopeMethod, from_hf
from longrope.encodings.errors import EncodingConfigError
from longrope.search.config.strict import MAX_FACTOR, JobConfigError
from longrope.workers.user_files import read_text_capped

# a factors file holds two lists of rotary_dim / 2 factors and its provenance: a few KB (128k-context models have
# 64 pairs), so 16 MiB refuses only what is no factors file, before it is read into memory
MAX_FACTORS_BYTES = 16 << 20


def package_version() -> str:
    try:
        return version("longrope-search")
    except PackageNotFoundError:
        return "unknown"


class LongRopeParameters(BaseModel):
    """The transformers / vLLM `rope_parameters` block for searched (or closed-form) per-pair factors.

    The cos/sin scale is written for both runtimes: transformers reads `attention_factor` (else derives it from
    `factor`), vLLM 0.33 reads `short_mscale` / `long_mscale` and ignores the other two. Our exports write all
    four with one value (`LongRope.for_both_runtimes`); files without the mscales (older exports, Phi-3 configs)
    are still read."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    rope_type: Literal["longrope"] = "longrope"
    rope_theta: float = Field(gt=1.0)
    long_factor: list[float]
    short_factor: list[float]
    original_max_position_embeddings: int = Field(gt=0)
    factor: float = Field(gt=0.0)
    attention_factor: float = Field(gt=0.0)
    short_mscale: float | None = Field(default=None, gt=0.0)
    long_mscale: float | None = Field(default=None, gt=0.0)
    partial_rotary_factor: float | None = Field(default=None, gt=0.0, le=1.0)

    @field_validator("long_factor")
    @classmethod
    def _searchable_long_factors(cls, values: list[float]) -> list[float]:
        problem = long_factor_problem(values)
        if problem:
            raise ValueError(problem)
        return values


def long_factor_problem(values) -> str | None:
    """Why `values` are no long factors a search could have found, or None. The one check of long factors, for
    every command that reads them (search and validate's seed files, verify, compare, extrapolation): each at
    least 1 (a factor below 1 squeezes positions, which no extension method does) and at most MAX_FACTOR (the
    search's max_factor bound), non-decreasing across pairs (LongRoPE's constraint, arXiv 2402.13753 sec. 3.2: a
    lower-frequency pair is never interpolated less than a higher-frequency one). transformers and vLLM would
    apply any positive factors; these would be applied, and verified, without having been searched."""
    for pair, value in enumerate(values):
        if not value >= 1.0:
            return f"factors must be >= 1, got {value} at pair {pair}"
        if value > MAX_FACTOR:
            return f"factors must be at most {MAX_FACTOR:g}, got {value} at pair {pair}"
    for pair in range(1, len(values)):
        if values[pair] < values[pair - 1]:
            return f"factors must be non-decreasing, got {values[pair - 1]} then {values[pair]} at pair {pair}"
    return None


class Provenance(BaseModel):
    """Where a factors file came from; later producers (the search) add their own fields."""

    model_config = ConfigDict(extra="allow")

    created_by: str
    version: str = Field(default_factory=package_version)
    method: str
    method_rope_parameters: dict[str, Any]
    seq_len: int | None = None


class FactorsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rope_parameters: LongRopeParameters
    max_position_embeddings: int = Field(gt=0)
    # a model whose every layer has a sliding window shorter than the target: what the factors were scored with
    # (the job's `model.sliding_window`); `full`: `export --into` turns the window off, as it was when scored
    sliding_window: Literal["keep", "full"] | None = None
    provenance: Provenance


def factors_file_for(
    method: RopeMethod, *, method_name: str, target_length: int, original_length: int, created_by: str
) -> FactorsFile:
    """State any RoPE method as LongRoPE factors at `target_length` (its long regime)."""
    longrope = LongRope.from_factors(
        method.factors(target_length),
        head_dim=method.head_dim,
        original_length=original_length,
        target_length=target_length,
        rope_theta=method.rope_theta,
        partial_rotary_factor=method.partial_rotary_factor,
        attention_factor=method.attention_factor,
    ).for_both_runtimes()
    return FactorsFile(
        rope_parameters=LongRopeParameters.model_validate(longrope.to_hf()),
        max_position_embeddings=target_length,
        provenance=Provenance(
            created_by=created_by,
            method=method_name,
            method_rope_parameters=method.to_hf(),
            seq_len=target_length,
        ),
    )


def read_factors_file(path: str | Path, where: str | None = None) -> FactorsFile:
    """A factors file, or one JobConfigError line naming it (`where`, default "factors file 'PATH'"): no such
    file, a FIFO or device (refused by kind, never opened), over MAX_FACTORS_BYTES, not UTF-8 (a binary file), not
    JSON (a CSV export: its factors file is the sidecar beside it), or not a factors file (the first field that is
    wrong, long factors by `long_factor_problem`)."""
    where = where or f"factors file {str(path)!r}"
    text = read_text_capped(Path(path), MAX_FACTORS_BYTES, "a factors file", where, JobConfigError)
    try:
        return FactorsFile.model_validate(json.loads(text))
    except json.JSONDecodeError as exc:
        raise JobConfigError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno}){_csv_hint(path)}") from exc
    except RecursionError as exc:
        raise JobConfigError(f"{where}: not a factors file (JSON nested too deeply)") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise JobConfigError(f"{where}: {field}: {first['msg'].removeprefix('Value error, ')}") from exc


def _csv_hint(path: str | Path) -> str:
    """For a file that is not JSON but is named .csv: where the factors file of a CSV export is (its sidecar,
    NAME.csv.json, which `longrope export --format csv` writes beside it)."""
    if Path(path).suffix.lower() != ".csv":
        return ""
    sidecar = Path(f"{path}.json")
    if sidecar.is_file():
        return f"; a CSV export: its factors file is {str(sidecar)!r} beside it"
    return "; a CSV export is read through its factors file, NAME.csv.json beside it (not found)"


def factors_encoding(factors: FactorsFile, *, head_dim: int, pairs: int, source: str) -> RopeMethod:
    """The LongRoPE encoding a factors file states, for a model with `pairs` rotary pairs of `head_dim`;
    `source` names the file (or flag) in the error when the counts differ."""
    count = len(factors.rope_parameters.long_factor)
    if count != pairs:
        raise JobConfigError(f"{source}: {count} factors, but this model has {pairs} rotary pairs")
    try:
        return from_hf(
            factors.rope_parameters.model_dump(exclude_none=True),
            head_dim=head_dim,
            max_position_embeddings=factors.max_position_embeddings,
        )
    except EncodingConfigError as exc:  # a block that is no LongRoPE of this shape: the error names the file
        raise JobConfigError(f"{source}: {exc}") from exc
