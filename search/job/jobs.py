"""Starting and resuming a search job: validate everything, then take the run directory's lock, then score.

Every check that can fail on bad input (config, model, data, seeds, a damaged run directory) runs before
anything is written. A new run writes config.json and job.json before the first candidate is scored, so the
directory can be resumed from the moment it exists. Resuming a finished run reads its state and best and stops
there: no model, no windows, no Ray (not even imported: the pool is imported only where a run scores).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longrope.search.config.job_config import JobConfig, digest
from longrope.search.config.strict import JobConfigError
from longrope.search.downloads.debian_docs import read_corpus_record
from longrope.search.job.job_context import JobContext
from longrope.search.job.validation_checks import file_checks_of
from longrope.search.optimizers.factory import make_searcher, search_plan
from longrope.search.optimizers.genome import Seed
from longrope.search.optimizers.history_record import HistoryRecord
from longrope.search.optimizers.objective import ObjectiveMix
from longrope.search.optimizers.searcher import Searcher
from longrope.search.run.coordinator import Coordinator, SearchProblem
from longrope.search.run.heartbeat import HEARTBEAT, HeartbeatWriter
from longrope.search.run.job_record import JOB_FILE, JobRecord, check_job_record
from longrope.search.run.replay import Outstanding, rebuild
from longrope.search.run.reporting import SearchReporter, SilentReporter
from longrope.search.run.run_check import CheckedRun, read_run
from longrope.search.run.run_store import CONFIG, RunDir, final_count, write_json_atomic
from longrope.search.run.stages import is_staged, stage_configs
from longrope.search.run.tensorboard_scalars import check_tensorboard_folder
from longrope.workers.corpus import corpus_provenance
from longrope.workers.documents import CORPUS_PREFIX
from longrope.workers.errors import DataError
from longrope.workers.windows import Windows


def run_search(
    config: JobConfig | None,
    *,
    resume_dir: str | Path | None = None,
    reporter: SearchReporter | None = None,
    sigterm_seen: Callable[[], bool] = lambda: False,
    backward_cost: float | Callable[[], float | None] | None = None,
) -> HistoryRecord:
    """Start a run in `config.output_dir`, or continue the one in `resume_dir`; returns the best record.
    `reporter`: where its lines and progress go (none: nothing is shown). `sigterm_seen`: whether the process got
    SIGTERM (the CLI knows; Ray may report one as Ctrl-C), so heartbeat.json records the true cause of a stop.
    `backward_cost`: what a backward window pass costs in forwards (estimate's c), for the window-equivalents of
    `search.tensorboard`'s scalars; None: they are left out, and a watched run with backward passes says so. A
    callable is asked only once every check has passed, when a run scores: pricing reads the model's config.json,
    and a `.gguf` model has none until it is converted."""
    options = _Options(reporter or SilentReporter(), sigterm_seen, backward_cost)
    job_dir = RunDir(resume_dir or config.output_dir)
    if resume_dir:
        job_dir.check_directory()  # a missing folder, a file, a link loop, a path too long: one line
    if is_staged(job_dir) if resume_dir else bool(config.search.stages):
        return _run_stages(config, job_dir, bool(resume_dir), options)
    return _resume(job_dir, config, options) if resume_dir else _start(config, options)


@dataclass(frozen=True)
class _Options:
    """How a search reports (lines and progress), the CLI's SIGTERM flag and the price of a backward pass: handed
    on to every stage."""

    reporter: SearchReporter
    sigterm_seen: Callable[[], bool]
    backward_cost: float | Callable[[], float | None] | None = None


def _start(config: JobConfig, options: _Options) -> HistoryRecord:
    """A new run: every check first, then config.json and job.json, then the search."""
    run_dir = RunDir(config.output_dir)
    run_dir.check_new(config)
    context = _checked_context(config)
    windows = _search_windows(context)
    with run_dir.lock():
        run_dir.create(config)  # checked again under the lock: another start may have won the race
        write_json_atomic(run_dir.file(JOB_FILE), job_record(context, windows, run_dir.config_hash()).sealed())
        return _score(context, run_dir, windows, _searcher(context), None, options)


def _resume(run_dir: RunDir, config: JobConfig | None, options: _Options) -> HistoryRecord:
    """A run to continue: its directory read and checked once, under its lock (`read_run`, the verdict every
    command gives); a finished one ends there, before any model, window or worker is touched. From then on the
    config is complete: the stored one, or the given one where it matches (it may move the run to other workers)."""
    run_dir.read_config()  # a folder that is no run directory says so before a lock is taken
    with run_dir.lock():
        checked = read_run(run_dir)
        if config is not None:
            run_dir.check_matches(config, stored=checked.config)
        if checked.finished:
            return _finished_already(checked, options.reporter)
        # the given workers section may move the run to another cluster; the windows cache follows the directory
        config = (config or checked.config).model_copy(update={"output_dir": str(run_dir.path)})
        context = _checked_context(config)
        searcher = _searcher(context)
        outstanding = rebuild(run_dir, searcher, checked.state, checked.history)
        windows = _search_windows(context)
        record = job_record(context, windows, run_dir.config_hash())
        if check_job_record(run_dir, checked.job, record):  # every check has passed: now the directory may be written
            write_json_atomic(run_dir.file(JOB_FILE), record.sealed())
        _cut_torn_tail(run_dir, checked, options.reporter)
        options.reporter.log(
            f"search: resuming at {searcher.position()} with {final_count(checked.records)} candidates already scored"
        )
        return _score(context, run_dir, windows, searcher, checked, options, outstanding)


def _cut_torn_tail(run_dir: RunDir, checked: CheckedRun, reporter: SearchReporter) -> None:
    if checked.history.torn_tail:
        run_dir.cut_torn_history(checked.history)
        reporter.log(
            f"search: warning: {run_dir.file('history.jsonl')} ended in a torn line "
            f"({len(checked.history.torn_tail)} bytes of a write cut short); cut it, and that candidate is scored again"
        )


def _finished_job(job_dir: RunDir, config: JobConfig, reporter: SearchReporter) -> HistoryRecord | None:
    """A staged job whose every stage is finished: its last stage's best, said in one line for the job, before
    any model, window or worker is touched; None while a stage is left to run."""
    folders = [RunDir(stage.output_dir) for stage in stage_configs(config, job_dir.path)]
    if not all(folder.file(CONFIG).is_file() and read_run(folder).finished for folder in folders):
        return None
    return _finished_already(read_run(folders[-1]), reporter, job_dir)


def _finished_already(checked: CheckedRun, reporter: SearchReporter, job_dir: RunDir | None = None) -> HistoryRecord:
    best, path = checked.scored_best(), (job_dir or checked.run_dir).path
    reporter.log(
        f"search {checked.config.name}: finished already, run dir {path} "
        f"(best search ppl {best.perplexity:.4f}); see `longrope status {path}`"
    )
    return best


def _run_stages(config: JobConfig | None, job_dir: RunDir, resume: bool, options: _Options) -> HistoryRecord:
    """A progressive job (`stages.py`): every stage is checked before anything is written, then the stages run in
    order, each started in its own directory or resumed there from its stored config (on the workers given now:
    `--resume JOB --set workers.X=...` moves every stage, and TensorBoard watches as asked now)."""
    if resume:
        stored = job_dir.read_config()
        if config is not None:
            job_dir.check_matches(config)
        config = config or stored
    else:
        job_dir.check_new(config)
    if resume and (finished := _finished_job(job_dir, config, options.reporter)):
        return finished
    stages = _checked_stages(config, job_dir)
    with job_dir.lock():
        if not resume:
            job_dir.create(config)  # checked again under the lock
        best: HistoryRecord | None = None
        for index, stage in enumerate(stages):
            folder = RunDir(stage.output_dir)
            options.reporter.log(
                f"search {config.name}: stage {index + 1}/{len(stages)} at {stage.target_length} tokens"
            )
            if not folder.file(CONFIG).is_file():
                best = _start(stage, options)
                continue
            stored_stage = folder.read_config()
            watched = stored_stage.search.model_copy(update={"tensorboard": config.search.tensorboard})
            best = _resume(
                folder, stored_stage.model_copy(update={"workers": config.workers, "search": watched}), options
            )
        return best


def _checked_stages(config: JobConfig, job_dir: RunDir) -> list[JobConfig]:
    """Every stage's config, model, search space and windows checked (the first stage's seeds too; a later
    stage's seeds are the stage before it), writing nothing: one error naming the stage. The whole job's file checks
    come first, before any stage's model is resolved: its last stage reads the longest windows, so data too short for
    any stage is named before a `.gguf` model is converted for the first."""
    file_checks_of(config)
    stages = stage_configs(config, job_dir.path)
    for index, stage in enumerate(stages):
        try:
            context = _checked_context(stage, files_checked=True) if index == 0 else JobContext.resolve(stage)
            context.space()
            context.objective_windows(
                stage.data.search_source, context.search_length, stage.data.search_windows, cached=False
            )
        except (JobConfigError, DataError) as exc:
            raise JobConfigError(f"search.stages: stage {index + 1} at {stage.target_length} tokens: {exc}") from exc
    return stages


def _checked_context(config: JobConfig, *, files_checked: bool = False) -> JobContext:
    """Resolve and check the model, the seeds, the data and the cluster; writes nothing. The cheap checks come
    first, as `validate` makes them (`file_checks_of`: both data sources read and measured in bytes against a
    window, not tokenized, and the tensorboard package; `files_checked`: made already, for the whole job), so a
    missing data folder, or documents too short for a window, are named before a `.gguf` model is dequantized into
    the conversion cache. The test source is read only by `compare`, after the search: a typo in it, or documents
    too short for the target, stop the job now, not after hours of scoring. A cluster address is connected to here
    (bounded), so "auto" with no cluster, or a dead one, fails before the run directory is made. A RUN/tensorboard
    that cannot hold the scalars is refused first too."""
    if not files_checked:
        file_checks_of(config)
    check_tensorboard_folder(config)
    context = JobContext.resolve(config)
    context.space()
    context.seeds()
    context.check_model()
    if config.workers.address:
        from longrope.workers.pool import ensure_ray  # Ray: only for a run that scores

        ensure_ray(context.pool_spec())
    return context


def _search_windows(context: JobContext) -> Windows:
    """The search windows (data too short for the target is an error here); writes only the windows cache."""
    data = context.config.data
    return context.objective_windows(data.search_source, context.search_length, data.search_windows)


def _searcher(context: JobContext) -> Searcher:
    config = context.config
    return make_searcher(
        config.search,
        pairs=context.pairs,
        scale=context.scale,
        seeds=context.seeds(),
        critical_dim=context.space().critical_dim,
        mix=ObjectiveMix.of(config.data.objective_weights(), config.data.search_windows),
    )


def _score(
    context: JobContext,
    run_dir: RunDir,
    windows: Windows,
    searcher: Searcher,
    checked: CheckedRun | None,
    options: _Options,
    outstanding: Outstanding | None = None,
) -> HistoryRecord:
    """Start the workers and search. heartbeat.json covers the workers' start too (Ray, model loads: minutes on a
    large model), so `status` sees the run alive then, and a worker that cannot start is its stop reason."""
    config, reporter = context.config, options.reporter
    reporter.log(
        f"search {config.name}: {context.start_length} -> {context.target_length} tokens "
        f"(scale {context.target_length / context.start_length:g}), {context.pairs} pairs, run dir {run_dir.path}"
    )
    from longrope.workers.pool import WorkerPool  # Ray: only for a run that scores

    mix = ObjectiveMix.of(config.data.objective_weights(), config.data.search_windows)
    problem = SearchProblem(
        pairs=context.pairs,
        scale=context.scale,
        seeds=context.seeds(),
        make_candidate=context.candidate,
        windows=len(mix.objectives),
        objective=mix,
        windows_hash=windows.content_hash,  # every history line names the windows it was scored on
    )
    heartbeat = HeartbeatWriter(run_dir.file(HEARTBEAT), sigterm_seen=options.sigterm_seen)
    with heartbeat.held():
        pool = WorkerPool(
            context.model_spec(),
            windows.tokens,
            context.pool_spec(),
            loss_mask=windows.loss_mask,
            record_failures=True,  # a candidate that fails on every worker is recorded as failed; the run goes on
        )
        try:
            coordinator = Coordinator(
                config.search,
                problem,
                run_dir,
                pool,
                searcher,
                reporter=reporter,
                heartbeat=heartbeat,
                backward_cost=_backward_cost(config, options),
                history=checked.records if checked else None,
                state=checked.state if checked else None,
                outstanding=outstanding.candidates if outstanding else (),
                outstanding_asked=outstanding.asked if outstanding else 0,
            )
            return coordinator.run()
        finally:
            pool.shutdown()


def _backward_cost(config: JobConfig, options: _Options) -> float | None:
    """c for the TensorBoard scalars' window-equivalents: only a watched run with backward passes needs one; one
    with no price given writes no window-equivalents, and says so."""
    if not config.search.tensorboard or not search_plan(config.search, 0).backward_steps:
        return None
    cost = options.backward_cost() if callable(options.backward_cost) else options.backward_cost
    if cost is None:
        options.reporter.log(
            "search: warning: search.tensorboard: no search/window_equivalents scalar (no price for a backward pass)"
        )
    return cost


def seeds_hash(seeds: list[Seed]) -> str:
    """Identity of the seeds as resolved: the optimizer's first generation is drawn from them."""
    return digest([[s.name, [float(v) for v in s.factors], s.attention_factor] for s in seeds])


def job_record(context: JobContext, windows: Windows, config_hash: str) -> JobRecord:
    """job.json for this run (`config_hash`: config.json's, as stored)."""
    return JobRecord(
        config_hash=config_hash,
        seeds_hash=seeds_hash(context.seeds()),
        model_dir=str(context.model_dir),
        **context.shape.model_dump(),
        search_windows_hash=windows.content_hash,
        search_windows={
            "count": len(windows.names),
            "tokens": int(windows.tokens.shape[1]),
            "documents": context.window_sources(context.config.data.search_source, windows),
        },
        corpus=source_provenance(context.config.data.search_source),
        **_kept_long_fields(context),
    )


def source_provenance(source: str) -> dict[str, str]:
    """What the search's documents are: the embedded corpus (the interpreter whose stdlib it is), a folder that
    `longrope corpus get` wrote (its corpus.json: package, version, checksum), or the path as given."""
    if source.startswith(CORPUS_PREFIX):
        return corpus_provenance()
    for folder in (Path(source), Path(source).parent):
        record = read_corpus_record(folder)
        if record is not None:
            package = f"{record.package} {record.version}"
            return {"source": source, "corpus": record.name, "package": package, "sha256": record.sha256}
    return {"source": source}


def _kept_long_fields(context: JobContext) -> dict[str, Any]:
    """A short-factor run records the long factors it kept, so its export needs nothing but the run directory."""
    kept = context.kept_long()
    if kept is None:
        return {}
    attention = context.candidate(kept.factors).attention_factor
    return {"factor": "short", "long_factor": [float(v) for v in kept.factors], "attention_factor": attention}
