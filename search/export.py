"""Exporting a run's best factors: a transformers/vLLM `rope_parameters` block (JSON), straight into a model's
config.json, or the official LongRoPE release's one-factor-per-line CSV."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from longrope.encodings import LongRope
from longrope.search.factors_file import FactorsFile, LongRopeParameters, Provenance
from longrope.search.job_config import JobConfigError
from longrope.search.jobs import JOB_FILE
from longrope.search.run_store import RunDir, seed_perplexities, write_json_atomic


class ExportError(ValueError):
    """The run cannot be exported as asked."""


def best_as_longrope(run_dir: RunDir, job: dict[str, Any]) -> tuple[LongRope, dict[str, Any]]:
    """The run's best candidate as a LongRoPE encoding, with the model shape recorded in its job.json."""
    best = run_dir.read_best()
    method = LongRope.from_factors(
        best["factors"],
        head_dim=job["head_dim"],
        original_length=job["original_length"],
        target_length=job["target_length"],
        rope_theta=job["rope_theta"],
        partial_rotary_factor=job["partial_rotary_factor"],
        attention_factor=best["attention_factor"],
        n_hat=best["n_hat"],
    )
    return method, best


def factors_file_of_run(run_dir: RunDir, *, allow_n_hat: bool = False) -> FactorsFile:
    config = run_dir.read_config()  # first, so a folder that is no run directory says so
    job = run_dir.read_json(JOB_FILE)
    method, best = best_as_longrope(run_dir, job)
    if method.n_hat and not allow_n_hat:
        raise ExportError(
            f"best candidate has n_hat = {method.n_hat}, which transformers and vLLM cannot express; "
            "pass --allow-n-hat to export it anyway (they will ignore n_hat)"
        )
    history = run_dir.read_history()
    state = run_dir.read_state() or {}
    block = method.to_hf()
    block.pop("n_hat", None)
    return FactorsFile(
        rope_parameters=LongRopeParameters.model_validate(block),
        max_position_embeddings=method.max_position_embeddings,
        provenance=Provenance(
            created_by="longrope export",
            method="longrope-search",
            method_rope_parameters=method.to_hf(),
            seq_len=method.max_position_embeddings,
            model=job["model_dir"],
            data_source=config.data.search_source,
            data_hash=job["search_windows_hash"],
            original_length=job["original_length"],
            target_length=job["target_length"],
            best_perplexity=best["perplexity"],
            baseline_perplexities=seed_perplexities(history),
            n_hat=method.n_hat,
            generations=state.get("evolution", {}).get("generation"),
            evaluations=len(history),
            config_hash=config.hash(),
        ),
    )


def write_export(factors: FactorsFile, out: Path, fmt: str) -> None:
    if fmt == "csv":
        out.write_text("\n".join(repr(float(v)) for v in factors.rope_parameters.long_factor) + "\n")
    else:
        write_json_atomic(out, factors.model_dump(mode="json", exclude_none=True))


def write_into_model(factors: FactorsFile, model_dir: Path) -> Path:
    """Put the block into MODEL_DIR/config.json, keeping a timestamped backup; returns the backup's path."""
    config_path = Path(model_dir) / "config.json"
    if not config_path.is_file():
        raise JobConfigError(f"--into {str(model_dir)!r}: no config.json there")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise JobConfigError(f"--into {str(model_dir)!r}: config.json is not valid JSON ({exc.msg})") from None
    backup = config_path.with_name(f"config.json.{time.strftime('%Y%m%d-%H%M%S')}.bak")
    shutil.copy2(config_path, backup)
    config.pop("rope_scaling", None)  # transformers would take a legacy rope_scaling over rope_parameters
    config["rope_parameters"] = factors.rope_parameters.model_dump(exclude_none=True)
    config["max_position_embeddings"] = factors.max_position_embeddings
    if "original_max_position_embeddings" in config:  # Phi-3 style: the top-level key wins in transformers
        config["original_max_position_embeddings"] = factors.rope_parameters.original_max_position_embeddings
    write_json_atomic(config_path, config)
    return backup
