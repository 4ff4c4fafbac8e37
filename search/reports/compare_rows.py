"""The given factors' rows: their labels, and their files checked against the job before anything is scored.

Each given factors file is a row labelled `file:`/`run:` plus the shortest path suffix that tells it apart from the
other given paths, or the NAME of `--label NAME=PATH`; a file of another model (original length, rope_theta, model
name) is refused, and one searched for another target length is scored under its label plus `@LENGTH`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

from longrope.encodings import RopeMethod
from longrope.search.config.factors_file import FactorsFile, factors_encoding
from longrope.search.config.strict import JobConfigError
from longrope.search.export.factors_export import factors_of_path
from longrope.search.job.job_context import JobContext
from longrope.search.reports.compare_result import BASELINES, VLLM_SUFFIX
from longrope.workers.user_files import repeated_path


def factors_method(context: JobContext, path: str, log=print) -> tuple[RopeMethod, int, str]:
    """A factors file, or a run directory (its best candidate, as `longrope export` writes it), as a row of this
    job: (its encoding, the target length it was searched for, the field that says so), its provenance checked
    against the job first (`check_provenance`)."""
    factors = factors_of_path(path)
    where = f"--factors {path}"
    searched, field = check_provenance(context, factors, where, log)
    method = factors_encoding(factors, head_dim=context.method.head_dim, pairs=context.pairs, source=where)
    return method, searched, field


def check_provenance(context: JobContext, factors: FactorsFile, where: str, log) -> tuple[int, str]:
    """Refuse factors of another model, before anything is scored: their original length (provenance's when
    given, and the block's `original_max_position_embeddings`, which runtimes read), their rope_theta, and the
    model provenance names, by its directory's name, since a model is found under other paths on other machines
    (the shipped demo factors name the reference model under the clone they were searched in). A file without
    provenance.model (`longrope encodings factors` writes none) has its RoPE checked only, and a line says so.
    Returns the target length the factors were searched for (provenance's, else `max_position_embeddings`) and
    the field it was read from: another length than the job's is compared, under a label that says it."""
    extra = factors.provenance.model_extra or {}
    block = factors.rope_parameters
    # a model that ships scaling: the block's short regime ends where the model's serving length does (the export
    # keeps the shipped model there), while provenance names the pre-training length
    lengths = {context.original_length, context.start_length}
    for field, value, allowed in (
        ("provenance.original_length", extra.get("original_length"), {context.original_length}),
        ("rope_parameters.original_max_position_embeddings", block.original_max_position_embeddings, lengths),
    ):
        if value is not None and value not in allowed:
            raise JobConfigError(
                f"{where}: original length {value} ({field}), this job's is {context.start_text()}; "
                "factors of another model"
            )
    if not math.isclose(block.rope_theta, context.method.rope_theta, rel_tol=1e-9):
        raise JobConfigError(
            f"{where}: rope_theta {block.rope_theta:g} (rope_parameters.rope_theta), this job's model has "
            f"{context.method.rope_theta:g}; factors of another model"
        )
    model = extra.get("model")
    if model is None:
        log(
            f"compare: {where}: no provenance.model ({factors.provenance.created_by}); its model is not checked, "
            "only its RoPE (rotary pairs, rope_theta, original length)"
        )
    elif model_name(model) != model_name(context.model_dir):
        raise JobConfigError(
            f"{where}: made for model {model_name(model)!r} (provenance.model {str(model)!r}); this job's model "
            f"is {model_name(context.model_dir)!r} (model.path {context.config.model.path!r}); compare it in a job "
            "of its model"
        )
    if extra.get("target_length") is not None:
        return int(extra["target_length"]), "provenance.target_length"
    return factors.max_position_embeddings, "max_position_embeddings"


def model_name(model_dir: str | Path) -> str:
    """A model directory's name, the part of its path that travels between machines: the folder's own name, or
    for a Hugging Face cache snapshot (models--ORG--NAME/snapshots/REVISION) the repository's folder, so two
    revisions of one model are one model."""
    path = Path(str(model_dir))
    return path.parent.parent.name if path.parent.name == "snapshots" else path.name


def given_methods(context: JobContext, rows: dict[str, str], log) -> tuple[dict[str, RopeMethod], dict[str, int]]:
    """The given factors' rows, {label: encoding}, and {label: the target length each was searched for}. A row
    searched for another length than the job's is scored as it is, at the job's lengths, under its label plus
    `@LENGTH`, with one line saying so: its factors are not this target's, and a bare label would read as if they
    were (a 512 export in a 1024 comparison scores worse than YaRN, which is no news about the search)."""
    methods: dict[str, RopeMethod] = {}
    searched_lengths: dict[str, int] = {}
    for label, path in rows.items():
        method, searched, field = factors_method(context, path, log)
        if searched != context.target_length:
            label = f"{label}@{searched}"
            log(
                f"compare: --factors {path}: searched for {searched} tokens ({field}), not this job's target "
                f"({context.target_length}); its row is {label}"
            )
        if label in methods:
            raise JobConfigError(f"compare: two rows labelled {label!r}; give one of them another NAME with --label")
        methods[label], searched_lengths[label] = method, searched
    return methods, searched_lengths


def factors_rows(sources: Sequence[str | Path | tuple[str, ...]]) -> dict[str, str]:
    """{row label: path} for the given factors files and run directories, in the order given.

    A plain path is labelled `file:` (a factors JSON) or `run:` (a run directory) plus the shortest suffix of its
    path that no other given path shares: one file keeps its bare name, a/factors.json and b/factors.json become
    file:a/factors.json and file:b/factors.json. A (NAME, PATH) pair (`--label NAME=PATH`) is labelled NAME.
    Rows are keyed by label, so one file given twice or two equal labels would silently drop a row: both are
    refused here, before any file is read or anything scored."""
    pairs = [_label_pair(source) for source in sources]
    _refuse_same_file_twice([path for _, path in pairs])
    plain = [path for label, path in pairs if label is None]
    automatic = iter(_distinguishing_labels(plain))
    rows: dict[str, str] = {}
    for label, path in pairs:
        label = next(automatic) if label is None else label
        if label in rows:
            raise JobConfigError(
                f"compare: two rows labelled {label!r} ({rows[label]} and {path}); give one of them another NAME "
                "with --label NAME=PATH"
            )
        rows[label] = path
    return rows


def _label_pair(source: str | Path | tuple[str, ...]) -> tuple[str | None, str]:
    """(label, path): (None, path) for a plain path; a `--label NAME=PATH` pair checked for a usable NAME (a row
    of its own, a markdown table cell, not mistakable for a baseline or a derived vLLM row)."""
    if not isinstance(source, tuple):
        return None, str(source)
    if len(source) != 2 or not all(part.strip() for part in source):
        raise JobConfigError(f"--label {'='.join(source)!r}: expected NAME=PATH")
    name, path = source[0].strip(), source[1]
    if name in BASELINES:
        raise JobConfigError(f"--label {name}={path}: {name!r} is a baseline's row; pick another NAME")
    if name.endswith(VLLM_SUFFIX):
        raise JobConfigError(f"--label {name}={path}: a NAME ending in {VLLM_SUFFIX!r} marks a derived vLLM row")
    if "|" in name or not name.isprintable():
        raise JobConfigError(f"--label {name!r}: NAME must be printable and without '|' (it is a markdown table cell)")
    return name, path


def _refuse_same_file_twice(paths: list[str]) -> None:
    repeated = repeated_path(paths)
    if repeated:
        raise JobConfigError(f"compare: {repeated}; give each factors file or run directory once")


def _kind(path: str) -> str:
    return "run:" if os.path.isdir(path) else "file:"  # False for what cannot be stat'ed; read_factors_file says why


def _distinguishing_labels(paths: list[str]) -> list[str]:
    """`file:`/`run:` plus, per path, the fewest trailing path components that no other path ends in (compared at
    the same depth, so labels of different depths differ too). Distinct absolute paths always get distinct labels:
    at worst the whole path."""
    keys = [(_kind(path), Path(os.path.abspath(path)).parts) for path in paths]
    labels = []
    for i, (kind, parts) in enumerate(keys):
        others = [key for j, key in enumerate(keys) if j != i]
        depth = next(
            k for k in range(1, len(parts) + 1) if all((o_kind, o[-k:]) != (kind, parts[-k:]) for o_kind, o in others)
        )
        labels.append(kind + str(Path(*parts[-depth:])))
    return labels
