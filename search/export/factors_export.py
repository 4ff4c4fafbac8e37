"""Exporting a run's best factors: a transformers/vLLM `rope_parameters` block (JSON), straight into a model's
config.json, or the official LongRoPE release's one-factor-per-line CSV."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path

from longrope.search.config.factors_file import FactorsFile, LongRopeParameters, Provenance, read_factors_file
from longrope.search.export.output_paths import check_not_run_directory, check_output_path, write_output
from longrope.search.optimizers.history_record import HistoryRecord
from longrope.search.run.job_record import read_job_record
from longrope.search.run.run_check import CheckedRun, read_run
from longrope.search.run.run_store import (
    CONFIG,
    RunDir,
    RunStoreError,
    final_count,
    seed_perplexities,
    write_json_atomic,
)
from longrope.search.run.stages import last_stage
from longrope.workers.errors import LongRopeError, ModelLoadError
from longrope.workers.families import FAMILIES, full_attention_overrides
from longrope.workers.models import ModelRope, model_rope, read_model_config


class ExportError(LongRopeError, ValueError):
    """The run cannot be exported as asked."""


def factors_file_of_run(run_dir: RunDir, *, allow_n_hat: bool = False) -> FactorsFile:
    """The run's best candidate (the lowest mean NLL in history.jsonl, the rule status uses too) as a factors file;
    for a progressive job, the last stage's. The run directory is read as every command reads it (`read_run`: its
    files checked against each other). The provenance says how far the search got: the last generation done of
    the run's last (numbered from 0, the initial population, as the search's log numbers them), and whether it
    finished (an export of a running or stopped search holds its best so far)."""
    config = run_dir.read_config()  # first, so a folder that is no run directory says so
    if config.search.stages:
        last = last_stage(run_dir)
        if not last.file(CONFIG).is_file():
            raise ExportError(f"{run_dir.path}: its last stage ({last.path.name}) has not started; nothing to export")
        return factors_file_of_run(last, allow_n_hat=allow_n_hat)
    run = read_run(run_dir)
    return candidate_factors_file(run, run.scored_best(), allow_n_hat=allow_n_hat)


def candidate_factors_file(run: CheckedRun, best: HistoryRecord, *, allow_n_hat: bool = False) -> FactorsFile:
    """One scored candidate of a run as a factors file, its provenance naming it (`best_key`, `best_perplexity`):
    the export of the run's best, and what a benchmark reads an earlier best-so-far as (bench/optimizer_arms.py)."""
    run_dir, config = run.run_dir, run.config
    job = run.job or read_job_record(run_dir)  # the model's shape is in job.json alone: its absence is the error
    method = job.deployed(job.candidate(best))
    if method.n_hat and not allow_n_hat:
        raise ExportError(
            f"best candidate has n_hat = {method.n_hat}, which transformers and vLLM cannot express; "
            "pass --allow-n-hat to export it anyway (they will ignore n_hat)"
        )
    block = method.for_both_runtimes().to_hf()
    block.pop("n_hat", None)
    return FactorsFile(
        rope_parameters=LongRopeParameters.model_validate(block),
        max_position_embeddings=method.max_position_embeddings,
        sliding_window=config.model.scored_window(),
        provenance=Provenance(
            created_by="longrope export",
            method="longrope-search",
            method_rope_parameters=method.to_hf(),
            seq_len=method.max_position_embeddings,
            model=job.model_dir,
            data_source=config.data.search_source,
            data_hash=job.search_windows_hash,
            original_length=job.original_length,
            target_length=job.target_length,
            best_perplexity=best.perplexity,
            best_key=best.key,
            baseline_perplexities=seed_perplexities(run.records),
            n_hat=method.n_hat,
            finished=run.finished,
            generation=run.generation_done,
            generations=run.last_generation,
            evaluations=final_count(run.records),
            config_hash=run_dir.config_hash(),
        ),
    )


def unfinished_warning(factors: FactorsFile, run_dir: RunDir) -> str | None:
    """The line an export of an unfinished search prints (None for a finished one): its best so far is not the
    search's result, and a later export may differ."""
    provenance = factors.provenance.model_extra or {}
    if provenance.get("finished", True):
        return None
    done = provenance.get("generation")
    progress = "generation 0 not done yet" if done is None else f"generation {done}/{provenance['generations']} done"
    return (
        f"export: warning: the search in {run_dir.path} is not finished ({progress}): this is its best so far "
        "(provenance.finished: false); a stopped search continues with `longrope search --resume`"
    )


STDOUT = "-"  # `-o -`: the factors file on stdout, as Unix tools read "-"
FORMATS = ("json", "csv")
FORMAT_OF_SUFFIX = {".json": "json", ".csv": "csv"}


def export_format(out: str | Path | None, fmt: str | None) -> str:
    """The format to write: `--format`, else the one -o's extension names (.csv, .json; case ignored), else JSON.
    A `--format` that the extension contradicts is refused: a .csv file holding JSON (or the reverse) breaks
    whatever reads it by its name, `np.loadtxt` in the LongRoPE release's loaders first."""
    named = FORMAT_OF_SUFFIX.get(Path(out).suffix.lower()) if out is not None and str(out) != STDOUT else None
    if fmt is None:
        return named or "json"
    if named is not None and named != fmt:
        raise ExportError(
            f"--format {fmt}: -o {str(out)!r} names a {named.upper()} file; name it .{fmt}, or leave --format out "
            "to take the format from the name"
        )
    return fmt


def factors_json(factors: FactorsFile) -> str:
    """The JSON export's text: the same bytes on stdout (`-o -`) as in a file."""
    return json.dumps(factors.model_dump(mode="json", exclude_none=True), indent=1)


def stdout_export(factors: FactorsFile, fmt: str) -> str:
    """What `-o -` prints: the factors file. A CSV export is two files (`write_csv_export`), which one stream
    cannot hold, so it is refused rather than printed without the sidecar that carries its attention factor."""
    if fmt == "csv":
        raise ExportError(
            "-o -: a CSV export comes with a sidecar file (the full factors file), which stdout cannot hold; "
            "give -o a file name, or print JSON"
        )
    return factors_json(factors)


def factors_of_path(path: str | Path) -> FactorsFile:
    """What `verify` and `compare --factors` take: a factors file, or a run directory, whose best candidate is
    read as `longrope export` writes it (`factors_file_of_run`). `os.path.isdir` looks at the path's metadata only
    and is False for anything it cannot stat, so a FIFO or a name too long goes to `read_factors_file`, which
    says what it is."""
    if os.path.isdir(path):
        return factors_file_of_run(RunDir(path))
    return read_factors_file(path)


def export_path(out: Path, where: str | None = None) -> Path:
    """`check_output_path` with the export's name for the path in its error (default: -o and the path)."""
    return check_output_path(out, where or f"-o {str(out)!r}")


def write_text_output(out: Path, text: str, where: str | None = None) -> None:
    write_output(out, lambda file: file.write(text), where or f"-o {str(out)!r}")


def write_export(factors: FactorsFile, out: Path, fmt: str) -> list[Path]:
    """Write the export; returns the files written (a CSV comes with its sidecar, see `write_csv_export`)."""
    export_path(out)
    if fmt == "csv":
        return write_csv_export(factors, out)
    write_text_output(out, factors_json(factors))
    return [out]


def csv_sidecar(out: Path) -> Path:
    """Where a CSV export's full factors file goes: beside it, `factors.csv` -> `factors.csv.json`."""
    return out.with_name(out.name + ".json")


def write_csv_export(factors: FactorsFile, out: Path) -> list[Path]:
    """The LongRoPE release's CSV: the long factors, one per line, nothing else. Its loaders read the file with
    `np.loadtxt(path, delimiter=',', skiprows=0)` and check the array's shape (microsoft/LongRoPE, evaluation/),
    so a header row would break them and the attention factor, mscales and provenance cannot go in. They go to a
    sidecar instead, the same factors file the JSON export writes, so the CSV loses nothing; `longrope verify`
    and `--seed-files` read it as they read any factors file. Both are written atomically, the sidecar first,
    so a CSV is never there without it."""
    block = factors.rope_parameters
    if any(v != 1.0 for v in block.short_factor):
        raise ExportError(
            "--format csv: the LongRoPE release's CSV holds one list of factors (the long ones), and these "
            "factors have searched short factors too; export JSON instead"
        )
    sidecar = csv_sidecar(out)
    where = f"-o {str(sidecar)!r} (its sidecar)"
    export_path(sidecar, where)
    write_text_output(sidecar, factors_json(factors), where)
    write_text_output(out, "\n".join(repr(float(v)) for v in block.long_factor) + "\n")
    return [out, sidecar]


def write_into_model(factors: FactorsFile, model_dir: Path) -> Path:
    """Put the block into MODEL_DIR/config.json, keeping a timestamped backup; returns the backup's path.

    Refused when the model's rotary pairs or original length differ from the run's: the factors of a model with
    another head_dim or pre-training length mean nothing there. config.json keeps its file mode."""
    config_path = Path(model_dir) / "config.json"
    check_not_run_directory(model_dir, f"--into {str(model_dir)!r}")
    try:
        config = read_model_config(model_dir)
        rope = model_rope(config)
    except ModelLoadError as exc:
        raise ExportError(f"--into {str(model_dir)!r}: {exc}") from exc
    check_same_shape(factors, rope, f"--into {str(model_dir)!r}")
    config = config_with_block(config, factors)
    backup = None
    try:
        backup = new_backup(config_path)
        write_json_atomic(config_path, config)
    except (OSError, RunStoreError) as exc:
        if backup is not None:
            with contextlib.suppress(OSError):
                backup.unlink()
        message = str(exc) if isinstance(exc, RunStoreError) else f"cannot write a backup ({exc.strerror or exc})"
        raise ExportError(f"--into {str(model_dir)!r}: {message}") from exc
    return backup


def config_with_block(config: dict, factors: FactorsFile) -> dict:
    """A model's config.json dict with the factors' block in force, as transformers reads it: the block as
    `rope_parameters`, no legacy `rope_scaling` (transformers would take it over rope_parameters), the factors'
    `max_position_embeddings`, and a Phi-3-style top-level `original_max_position_embeddings` (which wins in
    transformers) set to the block's. A model whose `rope_parameters` is keyed by layer type (Gemma 3) gets the
    block under the searched type only; its other types (the local layers) keep their own entry. Factors scored
    with `sliding_window: full` turn the model's window off, so what was scored is what gets deployed."""
    window_off = full_attention_overrides(config) if factors.sliding_window == "full" else {}
    config = {**config, **window_off}
    config.pop("rope_scaling", None)
    block = factors.rope_parameters.model_dump(exclude_none=True)
    layer_type = searched_layer_type(config)
    if layer_type:
        block = {**config["rope_parameters"], layer_type: block}
    config["rope_parameters"] = block
    config["max_position_embeddings"] = factors.max_position_embeddings
    if "original_max_position_embeddings" in config:
        config["original_max_position_embeddings"] = factors.rope_parameters.original_max_position_embeddings
    return config


def searched_layer_type(config: dict) -> str | None:
    """The layer type whose entry of a per-layer-type `rope_parameters` holds the searched block, or None for a
    model with one block (workers/families.py `Family.searched_layer_type`)."""
    family = FAMILIES.get(config.get("model_type"))
    params = config.get("rope_parameters")
    layer_type = family.searched_layer_type if family else None
    return layer_type if layer_type and isinstance(params, dict) and layer_type in params else None


def new_backup(config_path: Path) -> Path:
    """Copy config.json to config.json.<time>[.<n>].bak, a name no other export took (created exclusively), so two
    exports in one second never overwrite the backup of the original."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for attempt in range(1000):
        backup = config_path.with_name(f"config.json.{stamp}{f'.{attempt}' if attempt else ''}.bak")
        try:
            out = backup.open("xb")
        except FileExistsError:
            continue
        try:
            with out, config_path.open("rb") as source:
                shutil.copyfileobj(source, out)
            shutil.copystat(config_path, backup)
        except OSError:
            backup.unlink(missing_ok=True)  # no empty or partial backup left behind
            raise
        return backup
    raise OSError(f"no free backup name for {config_path}")


def check_same_shape(factors: FactorsFile, rope: ModelRope, where: str) -> None:
    """Refuse factors made for another model shape: rotary pairs and original length must match the model's."""
    block = factors.rope_parameters
    pairs = rope.rotary_dim // 2
    if pairs != len(block.long_factor):
        raise ExportError(
            f"{where}: the model has {pairs} rotary pairs (head_dim {rope.head_dim}), the factors are for "
            f"{len(block.long_factor)}; use a model of the factors' shape"
        )
    # a model that ships scaling (or holds an earlier export) has two lengths a block may start its long regime at
    if block.original_max_position_embeddings not in (rope.original_length, rope.serving_length):
        serving = "" if rope.shipped_scaling is None else f" (it serves {rope.serving_length} with its own scaling)"
        raise ExportError(
            f"{where}: the model's original length is {rope.original_length}{serving}, the factors' is "
            f"{block.original_max_position_embeddings}; use a model of the factors' shape"
        )
