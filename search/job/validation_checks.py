"""What `validate` checks and reports: each check one entry ("what", its value, "ok" or "skipped", how), the ones
made before the model is resolved (the data sources, read and measured in bytes, and the tensorboard package),
`--offline`'s, and the seed factors' and data sources' own checks that `search`, `compare` and `estimate` also make.

The order is the point: a `.gguf` model is dequantized into the conversion cache when it is resolved (minutes and
hundreds of MB for a real model), and a document is tokenized only after that. So whatever can be told from the
files alone (a source that is missing, empty, or whose documents have fewer bytes than a window needs tokens) is
told first, by every command that resolves the model."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import NamedTuple

import numpy as np

from longrope.search.config.factors_file import long_factor_problem, read_factors_file
from longrope.search.config.job_config import JobConfig
from longrope.search.config.strict import JobConfigError
from longrope.search.run.tensorboard_scalars import INSTALL
from longrope.workers.documents import CORPUS_PREFIX, TextDocument, read_source
from longrope.workers.errors import DataError


def check_seed_factors(where: str, factors: np.ndarray, pairs: int | None) -> None:
    """A seed's long factors: one per rotary pair (when the model's pair count is known), and what every reader of
    long factors checks (`long_factor_problem`: >= 1, bounded, non-decreasing)."""
    if pairs is not None and len(factors) != pairs:
        raise JobConfigError(f"{where}: expected {pairs} factors (rotary_dim / 2), got {len(factors)}")
    problem = long_factor_problem([float(f) for f in factors])
    if problem:
        raise JobConfigError(f"{where}: {problem}")


class WindowTokens(NamedTuple):
    """The tokens one window holds (read positions + 1) in each data source, as far as they are known before the
    model is resolved: a lower bound that the documents' bytes are checked against (`window_bytes_check`)."""

    search: int
    test: int


# the least original_length a config may give (JobConfig.original_length's bound): all that is known of a
# short-factor search's window before the model says its own length
LEAST_ORIGINAL_LENGTH = 2


def least_window_tokens(config: JobConfig) -> WindowTokens:
    """The windows `search` cuts and `validate` checks: the search's at target_length + 1 tokens (original_length + 1
    for a short-factor search), the test's at target_length + 1, the longest a default `compare` reads. A
    short-factor search with no original_length in its config reads windows as long as the model's own length, which
    only resolving the model tells (for a `.gguf`, by converting it), so its bound is the least a config may give;
    the token check after the model is resolved is then the one that counts."""
    if config.search.factor == "short":
        search = (config.original_length or LEAST_ORIGINAL_LENGTH) + 1
    else:
        search = config.target_length + 1
    return WindowTokens(search=search, test=config.target_length + 1)


def compare_window_tokens(config: JobConfig, lengths: list[int]) -> WindowTokens:
    """The windows `compare` cuts: the search source's at target_length + 1 (NTK and YaRN are tuned there, whatever
    the factor searched), the test source's at the longest of `lengths` + 1 (default: the lengths end at the
    target, which needs no model to know)."""
    test = max(lengths, default=config.target_length) + 1
    return WindowTokens(search=config.target_length + 1, test=test)


def check_source(field: str, source: str, text_field: str) -> list[TextDocument]:
    """A data source read as the search reads it (`read_source`: it exists and holds readable documents; every
    file parsed), but not tokenized: the windows are cut by the search. Returns its documents. The error names the
    field and the value, as a bad model.path does: "data.test_source: '/d' does not exist"."""
    try:
        return read_source(source, text_field=text_field)
    except DataError as exc:
        raise DataError(f"{field}: {str(exc).removeprefix('data source: ')}") from exc


def data_source_checks(
    config: JobConfig, *, offline: bool = False, tokens: WindowTokens | None = None, here_only: bool = False
) -> list[dict]:
    """The data sources' entries of `validate`'s checks, each source read (not tokenized) and, given `tokens`, its
    documents' bytes checked against a window's tokens (`window_bytes_check`). `--offline` skips the ones on disk
    (they may be on the cluster only), `here_only` the ones not on this machine (`estimate` prices a cluster's job
    from a laptop); `corpus:` sources ship with the package and are checked either way."""
    data = config.data
    checks = []
    for name in ("search_source", "test_source"):
        source = getattr(data, name)
        on_disk = not source.startswith(CORPUS_PREFIX)
        if on_disk and (offline or (here_only and not Path(source).exists())):
            reason = "--offline: not read" if offline else "not on this machine: not read"
            checks.append(validation_check(f"data.{name}", source, "skipped", reason))
            continue
        documents = check_source(f"data.{name}", source, data.text_field)
        if tokens is not None:
            length = tokens.search if name == "search_source" else tokens.test
            count = data.search_windows if name == "search_source" else data.test_windows
            window_bytes_check(f"data.{name}", source, documents, length=length, count=count)
        detail = f"{len(documents)} documents read (not tokenized)"
        checks.append(validation_check(f"data.{name}", source, "ok", detail))
    return checks


def file_checks_of(config: JobConfig) -> list[dict]:
    """What `validate` and `search` check without the model: the data sources read, their documents measured in
    bytes against the windows `least_window_tokens` knows of (not tokenized), and the tensorboard package. Made
    before the model is resolved, so a missing data folder, or one whose documents are all shorter than a window, is
    named at once, before a `.gguf` model is dequantized into the conversion cache (minutes, hundreds of MB)."""
    return [*data_source_checks(config, tokens=least_window_tokens(config)), *tensorboard_checks(config)]


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
    if Path(path).name == "config.json":
        return validation_check(field, path, "skipped", "--offline: a model's RoPE scaling is read with the model's")
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


def window_bytes_check(
    field: str, source: str, documents: list[TextDocument], *, length: int, count: int
) -> list[tuple[int, TextDocument]]:
    """`count` documents of at least `length` bytes, or one DataError naming the field and the value: a token is at
    least one byte of the text for byte-level BPE and the byte tokenizer alike, so a shorter document cannot hold a
    window of `length` tokens, and no tokenizer (no model) is needed to tell. Returns (bytes, document) of those
    long enough, longest first: the only ones worth tokenizing."""
    by_size = sorted(((_utf8_size(d.text), d) for d in documents), key=lambda item: -item[0])
    long_enough = [item for item in by_size if item[0] >= length]
    if len(long_enough) >= count:
        return long_enough
    if long_enough:  # once tokenized, these may still hold fewer tokens than a window: "at most"
        others = "the others have fewer bytes than a window's tokens" if by_size[len(long_enough) :] else "no others"
        shortfall = f"found at most {len(long_enough)}; {others}"
    else:
        longest = by_size[0][0] if by_size else 0
        shortfall = f"found 0; the longest has {longest} bytes, fewer than a window's tokens"
    raise DataError(_supply_problem(field, source, length, count, shortfall))


def window_supply_check(field: str, source: str, documents, tokenizer, *, length: int, count: int) -> dict:
    """`count` documents of at least `length` tokens, one window each (a window never crosses two documents;
    `windows.select_windows`). The bytes are checked first (`window_bytes_check`), and only documents of at least
    `length` bytes are tokenized, longest first, until `count` are found."""
    found, longest = 0, 0
    for _, document in window_bytes_check(field, source, documents, length=length, count=count):
        tokens = len(tokenizer.encode(document.text))
        longest, found = max(longest, tokens), found + (tokens >= length)
        if found >= count:
            detail = f"{count} documents of >= {length} tokens found, a window each"
            return validation_check(f"{field} windows", source, "ok", detail)
    raise DataError(_supply_problem(field, source, length, count, f"found {found}; the longest has {longest} tokens"))


def _supply_problem(field: str, source: str, length: int, count: int, shortfall: str) -> str:
    return (
        f"{field} = {source!r}: {count} windows of {length} tokens need {count} documents at least that long (a "
        f"window never crosses two), {shortfall}"
    )


def _utf8_size(text: str) -> int:
    """The bytes a tokenizer reads of `text` (a JSONL string may hold a lone surrogate: counted, not refused)."""
    return len(text.encode("utf-8", errors="surrogatepass"))
