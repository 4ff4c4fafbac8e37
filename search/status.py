"""`longrope status RUN_DIR`: where a running or finished search stands, best vs its seeds, and an ETA."""

from __future__ import annotations

import statistics
from typing import Any

from longrope.search.job_record import JOB_FILE, read_job_record
from longrope.search.run_store import RunDir, RunStoreError, best_of, final_count, seed_perplexities
from longrope.search.stages import stage_lengths, started_stages


def run_status(run_dir: RunDir) -> dict[str, Any]:
    """A run's status; a progressive job's is its latest started stage's, with the stage named."""
    config = run_dir.read_config()
    if config.search.stages:
        started = started_stages(run_dir)
        if not started:
            raise RunStoreError(f"{run_dir.path}: no stage has started yet")
        status = run_status(started[-1])
        status["stage"] = f"{len(started)}/{len(stage_lengths(config))}"
        return status
    state = run_dir.read_state() or {"evolution": {"generation": 0}, "generation_seconds": []}
    history = run_dir.read_history()
    total = state.get("total_generations") or 1 + config.search.generations
    done = int(state["evolution"]["generation"])
    seconds = state["generation_seconds"]
    finished = bool(state.get("finished"))
    eta = None if finished or not seconds else statistics.median(seconds[1:] or seconds) * (total - done)
    best = best_of(history)
    seeds = seed_perplexities(history)
    return {
        "run_dir": str(run_dir.path),
        "name": config.name,
        "generation": done,
        "generations": total,
        "evaluations": final_count(history),
        "stopped_by_racing": sum(1 for r in history.values() if r.get("status") == "stopped"),
        "finished": finished,
        "stopped_early": bool(state.get("stopped_early")),
        "best_perplexity": best["perplexity"] if best else None,
        "best_key": best["key"] if best else None,
        "seed_perplexities": seeds,
        "eta_seconds": eta,
        **record_fields(run_dir, best),
    }


def record_fields(run_dir: RunDir, best: dict | None) -> dict[str, Any]:
    """What job.json says about the run: its model and lengths, and the best candidate as the encoding it was
    scored with (its attention factor; a short-factor run's kept one). Empty before job.json is written."""
    if not run_dir.file(JOB_FILE).is_file():
        return {}
    job = read_job_record(run_dir)
    fields: dict[str, Any] = {
        "model": job.model_dir,
        "original_length": job.original_length,
        "target_length": job.target_length,
        "factor": job.factor,
    }
    if best:
        fields["best_attention_factor"] = job.candidate(best).attention_factor
    return fields


def format_status(status: dict[str, Any]) -> str:
    stage = f" (stage {status['stage']})" if status.get("stage") else ""
    lines = [
        f"run {status['name']} in {status['run_dir']}{stage}",
        f"  generation {status['generation']}/{status['generations']}, {status['evaluations']} evaluations"
        + (f" ({status['stopped_by_racing']} stopped by racing)" if status["stopped_by_racing"] else "")
        + ", "
        + ("finished" + (" (stopped early)" if status["stopped_early"] else "") if status["finished"] else "running"),
    ]
    if "model" in status:
        lines.append(
            f"  {status['original_length']} -> {status['target_length']} tokens ({status['factor']} factors), "
            f"model {status['model']}"
        )
    if status["best_perplexity"] is not None:
        attention = status.get("best_attention_factor")
        scale = f", attention factor {attention:.4f}" if attention is not None else ""
        lines.append(f"  best perplexity {status['best_perplexity']:.4f} (candidate {status['best_key']}{scale})")
    for name, ppl in sorted(status["seed_perplexities"].items(), key=lambda item: item[1] or float("inf")):
        gain = f"  best is {100 * (1 - status['best_perplexity'] / ppl):.1f}% lower" if ppl else ""
        lines.append(f"  seed {name:12s} perplexity {ppl:.4f}{gain}" if ppl else f"  seed {name:12s} diverged")
    if status["eta_seconds"] is not None:
        lines.append(f"  ETA {status['eta_seconds'] / 60:.1f} min")
    return "\n".join(lines)
