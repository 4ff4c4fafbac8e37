"""Starting and resuming a search job: validate everything, then take the run directory's lock, then score.

Every check that can fail on bad input (config, model, data, seeds, a damaged run directory) runs before
anything is written. A new run writes config.json and job.json before the first candidate is scored, so the
directory can be resumed from the moment it exists.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from longrope.search.coordinator import Coordinator, SearchProblem
from longrope.search.genome import Seed
from longrope.search.job_config import JobConfig, JobConfigError
from longrope.search.job_context import JobContext
from longrope.search.job_record import JOB_FILE, JobRecord, check_job_record
from longrope.search.objective import ObjectiveMix
from longrope.search.optimizers import make_optimizer
from longrope.search.run_store import CONFIG, RunDir, final_count, write_json_atomic
from longrope.search.stages import is_staged, stage_configs
from longrope.workers.corpus import corpus_provenance
from longrope.workers.errors import DataError
from longrope.workers.pool import WorkerPool, ensure_ray
from longrope.workers.windows import Windows


def run_search(
    config: JobConfig | None,
    *,
    resume_dir: str | Path | None = None,
    show_progress: bool = True,
    console: Console | None = None,
) -> dict[str, Any]:
    """Start a run in `config.output_dir`, or continue the one in `resume_dir`; returns the best record."""
    console = console or Console(stderr=True)
    if (resume_dir and is_staged(RunDir(resume_dir))) or (not resume_dir and config.search.stages):
        return _run_stages(config, resume_dir, console, show_progress)
    if resume_dir:
        run_dir = RunDir(resume_dir)
        stored = run_dir.read_config()  # a folder that is no run directory says so before a lock is taken
        with run_dir.lock():
            return _resume(run_dir, stored, config, console, show_progress)
    run_dir = RunDir(config.output_dir)
    run_dir.check_new(config)
    context = _checked_context(config)
    windows = _search_windows(context)
    with run_dir.lock():
        run_dir.check_new(config)  # again under the lock: another start may have won the race
        run_dir.create(config)
        write_json_atomic(run_dir.file(JOB_FILE), job_record(context, windows).model_dump(mode="json"))
        coordinator = _coordinator(config, context, run_dir, console, show_progress)
        return _run(coordinator, context, windows, console)


def _resume(
    run_dir: RunDir, stored: JobConfig, config: JobConfig | None, console: Console, show_progress: bool
) -> dict[str, Any]:
    if config is not None:
        run_dir.check_matches(config)  # equal but for where it is written and who scores it
    # the given workers section may move the run to another cluster; the windows cache follows the directory
    config = (config or stored).model_copy(update={"output_dir": str(run_dir.path)})
    context = _checked_context(config)
    coordinator = _coordinator(config, context, run_dir, console, show_progress)
    history = coordinator.resume()  # a damaged run directory stops here, before the windows cache is written
    windows = _search_windows(context)
    record = job_record(context, windows)
    write_job = check_job_record(run_dir, record)
    # every check has passed: now the directory may be written
    if write_job:
        write_json_atomic(run_dir.file(JOB_FILE), record.model_dump(mode="json"))
    if history.torn_tail:
        run_dir.cut_torn_history(history)
        console.print(
            f"search: warning: {run_dir.file('history.jsonl')} ended in a torn line ({len(history.torn_tail)} bytes "
            "of a write cut short); cut it, and that candidate is scored again"
        )
    console.print(
        f"search: resuming at generation {coordinator.optimizer.generation}/{coordinator.total_generations} "
        f"with {final_count(coordinator.history)} candidates already scored"
    )
    return _run(coordinator, context, windows, console)


def _run_stages(
    config: JobConfig | None, resume_dir: str | Path | None, console: Console, show_progress: bool
) -> dict[str, Any]:
    """A progressive job (`stages.py`): every stage is checked before anything is written, then the stages run
    in order, each started in its own directory or resumed there from its stored config (on the workers given
    now: `--resume JOB --set workers.X=...` moves every stage)."""
    job_dir = RunDir(resume_dir or config.output_dir)
    if resume_dir:
        stored = job_dir.read_config()
        if config is not None:
            job_dir.check_matches(config)
        config = config or stored
    else:
        job_dir.check_new(config)
    stages = _checked_stages(config, job_dir)
    with job_dir.lock():
        if not resume_dir:
            job_dir.check_new(config)
            job_dir.create(config)
        best: dict[str, Any] = {}
        for index, stage in enumerate(stages):
            folder = RunDir(stage.output_dir)
            console.print(f"search {config.name}: stage {index + 1}/{len(stages)} at {stage.target_length} tokens")
            started = folder.file(CONFIG).is_file()
            if started:
                stage = folder.read_config().model_copy(update={"workers": config.workers})
            best = run_search(
                stage, resume_dir=folder.path if started else None, show_progress=show_progress, console=console
            )
        return best


def _checked_stages(config: JobConfig, job_dir: RunDir) -> list[JobConfig]:
    """Every stage's config, model, search space and windows checked (the first stage's seeds too; a later
    stage's seeds are the stage before it), writing nothing: one error naming the stage."""
    stages = stage_configs(config, job_dir.path)
    for index, stage in enumerate(stages):
        try:
            context = _checked_context(stage) if index == 0 else JobContext.resolve(stage)
            context.space()
            context.objective_windows(
                stage.data.search_source, context.search_length, stage.data.search_windows, cached=False
            )
        except (JobConfigError, DataError) as exc:
            raise JobConfigError(f"search.stages: stage {index + 1} at {stage.target_length} tokens: {exc}") from None
    return stages


def _checked_context(config: JobConfig) -> JobContext:
    """Resolve and check the model, the seeds and the cluster; writes nothing. A cluster address is connected to
    here (bounded), so "auto" with no cluster, or a dead one, fails before the run directory is made."""
    context = JobContext.resolve(config)
    context.space()
    context.seeds()
    context.check_model()
    if config.workers.address:
        ensure_ray(context.pool_spec())
    return context


def _search_windows(context: JobContext) -> Windows:
    """The search windows (data too short for the target is an error here); writes only the windows cache."""
    data = context.config.data
    return context.objective_windows(data.search_source, context.search_length, data.search_windows)


def _coordinator(
    config: JobConfig, context: JobContext, run_dir: RunDir, console: Console, show_progress: bool
) -> Coordinator:
    seeds = context.seeds()
    mix = ObjectiveMix.of(config.data.objective_weights(), config.data.search_windows)
    problem = SearchProblem(
        pairs=context.pairs,
        scale=context.scale,
        seeds=seeds,
        make_candidate=context.candidate,
        windows=len(mix.objectives),
        objective=mix,
    )
    optimizer = make_optimizer(
        config.search, pairs=context.pairs, scale=context.scale, seeds=seeds, critical_dim=context.space().critical_dim
    )
    return Coordinator(config.search, problem, run_dir, None, optimizer, console=console, show_progress=show_progress)


def _run(coordinator: Coordinator, context: JobContext, windows: Windows, console: Console) -> dict[str, Any]:
    config = context.config
    if coordinator.finished:  # a resumed finished run: no worker needs to start
        console.print(f"search {config.name}: finished already, run dir {coordinator.run_dir.path}")
        return coordinator.best_record()
    console.print(
        f"search {config.name}: {context.original_length} -> {context.target_length} tokens "
        f"(scale {context.scale:g}), {context.pairs} pairs, run dir {coordinator.run_dir.path}"
    )
    pool = WorkerPool(context.model_spec(), windows.tokens, context.pool_spec(), loss_mask=windows.loss_mask)
    coordinator.evaluator = pool
    try:
        return coordinator.run()
    finally:
        pool.shutdown()


def seeds_hash(seeds: list[Seed]) -> str:
    """Identity of the seeds as resolved: the optimizer's first generation is drawn from them."""
    payload = [[s.name, [float(v) for v in s.factors], s.attention_factor] for s in seeds]
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:16]


def job_record(context: JobContext, windows: Windows) -> JobRecord:
    return JobRecord(
        seeds_hash=seeds_hash(context.seeds()),
        model_dir=str(context.model_dir),
        original_length=context.original_length,
        target_length=context.target_length,
        rope_theta=context.method.rope_theta,
        head_dim=context.method.head_dim,
        partial_rotary_factor=context.method.partial_rotary_factor,
        search_windows_hash=windows.content_hash,
        search_windows={"count": len(windows.names), "tokens": int(windows.tokens.shape[1])},
        corpus=corpus_provenance(),
        **_kept_long_fields(context),
    )


def _kept_long_fields(context: JobContext) -> dict[str, Any]:
    """A short-factor run records the long factors it kept, so its export needs nothing but the run directory."""
    kept = context.kept_long()
    if kept is None:
        return {}
    attention = context.candidate(kept.factors).attention_factor
    return {"factor": "short", "long_factor": [float(v) for v in kept.factors], "attention_factor": attention}
