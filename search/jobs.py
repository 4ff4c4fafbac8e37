"""Starting and resuming a search job: validate everything, then score on the worker pool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from longrope.search.coordinator import Coordinator, SearchProblem
from longrope.search.job_config import JobConfig
from longrope.search.job_context import JobContext
from longrope.search.run_store import RunDir, write_json_atomic
from longrope.workers.corpus import corpus_provenance
from longrope.workers.pool import WorkerPool

JOB_FILE = "job.json"


def run_search(
    config: JobConfig | None,
    *,
    resume_dir: str | Path | None = None,
    show_progress: bool = True,
    console: Console | None = None,
) -> dict[str, Any]:
    """Start a run in `config.output_dir`, or continue the one in `resume_dir`; returns the best record."""
    console = console or Console(stderr=True)
    run_dir = RunDir(resume_dir or config.output_dir)
    if resume_dir:
        stored = run_dir.read_config()
        if config is not None:
            run_dir.check_matches(config)
        config = stored
    else:
        run_dir.check_new(config)
    context = JobContext.resolve(config)  # every input check runs before anything is written or scored
    problem = SearchProblem(
        pairs=context.pairs, scale=context.scale, seeds=context.seeds(), make_candidate=context.longrope
    )
    coordinator = Coordinator(
        config.search, problem, run_dir, evaluator=None, console=console, show_progress=show_progress
    )
    if resume_dir:
        coordinator.resume()  # a damaged run directory stops here, before anything is written
    windows = context.windows(config.data.search_source, config.target_length, config.data.search_windows)
    if not resume_dir:
        run_dir.create(config)
        write_json_atomic(
            run_dir.file(JOB_FILE),
            {
                "model_dir": str(context.model_dir),
                "original_length": context.original_length,
                "target_length": context.target_length,
                "rope_theta": context.method.rope_theta,
                "head_dim": context.method.head_dim,
                "partial_rotary_factor": context.method.partial_rotary_factor,
                "search_windows_hash": windows.content_hash,
                "search_windows": {"count": len(windows.names), "tokens": int(windows.tokens.shape[1])},
                "corpus": corpus_provenance(),
            },
        )
    console.print(
        f"search {config.name}: {context.original_length} -> {context.target_length} tokens "
        f"(scale {context.scale:g}), {context.pairs} pairs, run dir {run_dir.path}"
    )
    pool = WorkerPool(context.model_spec(), windows.tokens, context.pool_spec())
    coordinator.evaluator = pool
    try:
        return coordinator.run()
    finally:
        pool.shutdown()
