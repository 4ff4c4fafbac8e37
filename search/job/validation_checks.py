"""What `validate` checks and reports: each check one entry ("what", its value, "ok" or "skipped", how), the ones
made before the model is resolved (the data sources, the tensorboard package), `--offline`'s, and the seed
factors' and data sources' own checks that `search` and `compare` also make."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from longrope.search.config.factors_file import long_factor_problem, read_factors_file
from longrope.search.config.job_config import JobConfig
from longrope.search.config.strict import JobConfigError
from longrope.search.run.tensorboard_scalars import INSTALL
from longrope.workers.documents import CORPUS_PREFIX, read_source
from longrope.workers.errors import DataError


def check_seed_factors(where: str, factors: np.ndarray, pairs: int | None) -> None:
    """A seed's long factors: one per rotary pair (when the model's pair count is known), and what every reader of
    long factors checks (`long_factor_problem`: >= 1, bounded, non-decreasing)."""
    if pairs is not None and len(factors) != pairs:
        raise JobConfigError(f"{where}: expected {pairs} factors (rotary_dim / 2), got {len(factors)}")
    problem = long_factor_problem([float(f) for f in factors])
    if problem:
        raise JobConfigError(f"{where}: {problem}")


def check_source(field: str, source: str, text_field: str) -> int:
    """A data source read as the search reads it (`read_source`: it exists and holds readable documents; every
    file parsed), but not tokenized: the windows are cut by the search. Returns the number of documents. The
    error names the field and the value, as a bad model.path does: "data.test_source: '/d' does not exist"."""
    try:
        return len(read_source(source, text_field=text_field))
    except DataError as exc:
        raise DataError(f"{field}: {str(exc).removeprefix('data source: ')}") from exc


def data_source_checks(config: JobConfig, *, offline: bool = False) -> list[dict]:
    """The data sources' entries of `validate`'s checks. `--offline` skips the ones on disk (they may be on the
    cluster only); `corpus:` sources ship with the package and are checked either way."""
    checks = []
    for name in ("search_source", "test_source"):
        source = getattr(config.data, name)
        if offline and not source.startswith(CORPUS_PREFIX):
            checks.append(validation_check(f"data.{name}", source, "skipped", "--offline: not read"))
            continue
        count = check_source(f"data.{name}", source, config.data.text_field)
        checks.append(validation_check(f"data.{name}", source, "ok", f"{count} documents read (not tokenized)"))
    return checks


def file_checks_of(config: JobConfig) -> list[dict]:
    """What `validate` checks without the model: the data sources read (not tokenized) and the tensorboard package.
    Made before the model is resolved, so a missing data folder is named at once, before a `.gguf` model is
    dequantized into the conversion cache (minutes, hundreds of MB)."""
    return [*data_source_checks(config), *tensorboard_checks(config)]


def offline_checks(config: JobConfig) -> list[dict]:
    """`validate --offline`: a cluster's config on a machine without its model or data. The config itself is
    checked (it is loaded before this runs), and every factors file present here; what needs the model or the
    cluster's files is listed as skipped. Imports neither torch nor Ray."""
    original = config.original_length
    lengths = (
        validation_check("lengths", config.target_length, "ok", f"target_length > original_length ({original})")
        if original
        else validation_check("lengths", config.target_length, "skipped", "original_length comes from the model")
    )
    return [
        validation_check("config", None, "ok", "fields, types, ranges and cross-field rules"),
        validation_check("model.path", config.model.path, "skipped", "--offline: not read (config.json, tokenizer)"),
        lengths,
        validation_check("search.seeds", list(config.search.seeds), "skipped", "computed from the model's RoPE"),
        *[_offline_factors_check(field, path) for field, path in _factors_paths(config)],
        *data_source_checks(config, offline=True),
        *tensorboard_checks(config, offline=True),
    ]


def _factors_paths(config: JobConfig) -> list[tuple[str, str]]:
    search = config.search
    paths = [("search.seed_files", path) for path in search.seed_files]
    return paths + ([("search.long_factors", search.long_factors)] if search.long_factors else [])


def _offline_factors_check(field: str, path: str) -> dict:
    """A factors file present here is read and its long factors checked (>= 1, non-decreasing; their count
    needs the model); a run directory or a path that exists only on the cluster is skipped."""
    if not Path(path).is_file():
        return validation_check(field, path, "skipped", "--offline: not a factors file on this machine")
    read_factors_file(path, f"{field}: {path}")  # its long factors checked as it is read (`long_factor_problem`)
    return validation_check(field, path, "ok", "long factors >= 1 and non-decreasing (their count needs the model)")


def tensorboard_checks(config: JobConfig, *, offline: bool = False) -> list[dict]:
    """`search.tensorboard: true` needs the tensorboard package on the machine that runs `longrope search`
    (--offline: maybe not this one, so a missing package is a skip there, not an error)."""
    if not config.search.tensorboard:
        return []
    if importlib.util.find_spec("tensorboard") is None:
        missing = (
            f"search.tensorboard: true needs the tensorboard package, which is not installed here: {INSTALL} "
            "(or set search.tensorboard: false)"
        )
        if not offline:
            raise JobConfigError(missing)
        return [validation_check("search.tensorboard", True, "skipped", f"--offline: {missing}")]
    detail = "the tensorboard package is installed (scalars go to RUN/tensorboard/)"
    return [validation_check("search.tensorboard", True, "ok", detail)]


def validation_check(what: str, value, result: str, detail: str) -> dict:
    """One entry of `validate`'s "checks" list: what was looked at, its value, "ok" or "skipped", and how."""
    return {"what": what, "value": value, "result": result, "detail": detail}


def window_supply_checks(config: JobConfig, tokenizer, *, search_length: int, test_length: int) -> list[dict]:
    """Each data source holds a document for each of its windows: the search's at `search_length` tokens, the
    test's at the longest a compare reads (`test_length`). What `search` and `compare` would otherwise find only
    after the model is loaded and every document tokenized."""
    data = config.data
    wanted = (("search_source", search_length, data.search_windows), ("test_source", test_length, data.test_windows))
    checks = []
    for name, length, count in wanted:
        source = getattr(data, name)
        documents = read_source(source, text_field=data.text_field)
        checks.append(window_supply_check(f"data.{name}", source, documents, tokenizer, length=length, count=count))
    return checks


def window_supply_check(field: str, source: str, documents, tokenizer, *, length: int, count: int) -> dict:
    """`count` documents of at least `length` tokens, one window each (a window never crosses two documents;
    `windows.select_windows`). Longest first, and only documents of at least `length` bytes are tokenized: a token
    is at least one byte of the text for byte-level BPE and the byte tokenizer alike, so a shorter one cannot hold
    a window. Stops once `count` are found."""
    found, longest = 0, 0
    by_size = sorted(((len(d.text.encode()), d) for d in documents), key=lambda item: -item[0])
    for size, document in by_size:
        if size < length:
            break
        tokens = len(tokenizer.encode(document.text))
        longest, found = max(longest, tokens), found + (tokens >= length)
        if found >= count:
            detail = f"{count} documents of >= {length} tokens found, a window each"
            return validation_check(f"{field} windows", source, "ok", detail)
    longest_text = (
        f"{longest} tokens" if longest else f"{by_size[0][0] if by_size else 0} bytes, fewer than a window's tokens"
    )
    raise DataError(
        f"{field} = {source!r}: {count} windows of {length} tokens need {count} documents at least that long (a "
        f"window never crosses two), found {found}; the longest has {longest_text}"
    )
