"""A run directory read as one whole, its files checked against each other: the one verdict every reader gives.

A run directory's files are written by one search, but users copy, edit and merge them, and each file alone can
look fine: a job.json whose target length was changed by hand, history lines appended from another run, a
state.json copied from a longer run. Read file by file, `status` would report another run's progress, `export`
would write factors under another length, a resumed run would call a copied line its best. So `read_run` reads
config.json, job.json, history.jsonl and state.json and checks each against the others, the way a resumed run
needs them to agree, and refuses in one line naming the file that disagrees:

- config.json: its config hash (edited by hand?);
- job.json: its own record hash, the config it belongs to, and what the config fixes (lengths, factor kind,
  window count and length, model path);
- history.jsonl: each line valid on its own (`HistoryRecord`), one final record per candidate, each carrying the
  job's windows (their hash and count, the same tokens per window as every other line), the model's pair count,
  and a mean NLL that is what its per-window NLLs give under the job's objective;
- state.json: the config it belongs to, the optimizer the config names, its generation counts against the
  config and the history; and for a steady GA, whose own state it holds, parents that history.jsonl holds as
  told. Nothing in it copies the history: a resume takes a steady GA's told candidates, and the early stop's best
  after each generation, from history.jsonl, and rebuilds every other searcher by replaying it, refusing a line
  the search does not ask for (`replay.check_replayed`).

status, export, compare and verify (run directories as factors), seeds from a run and `--resume` all read a run
through `read_run`, so one directory gets one verdict. It writes nothing.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass
from typing import Any

from longrope.search.config.job_config import JobConfig
from longrope.search.optimizers.factory import search_plan, searcher_class
from longrope.search.optimizers.gradient import WindowSplit
from longrope.search.optimizers.history_record import HistoryRecord
from longrope.search.optimizers.objective import ObjectiveMix
from longrope.search.optimizers.searcher import SearchProgress
from longrope.search.run.job_record import JOB_FILE, JobRecord, read_job_record
from longrope.search.run.run_store import (
    HISTORY,
    NOT_SCORED_YET,
    STATE,
    History,
    Records,
    RunDir,
    RunState,
    RunStoreError,
    best_of,
)

MONOTONE_TOLERANCE = 1e-9  # factors are recorded rounded to 6 decimals, which keeps their order


@dataclass(frozen=True)
class CheckedRun:
    """A run directory's files, read and found to agree (see the module docstring)."""

    run_dir: RunDir
    config: JobConfig
    job: JobRecord | None  # None: not written yet, or lost (a resume writes it again; export needs it)
    state: RunState | None  # None: no generation has ended yet
    history: History

    @property
    def records(self) -> Records:
        return self.history.records

    @property
    def best(self) -> HistoryRecord | None:
        return best_of(self.records)

    def scored_best(self) -> HistoryRecord:
        """The best candidate, for a reader that needs one (export, compare and verify of a run, a seed, a resume
        of a finished run): refused in one line where none has a finite score, a run still starting or one whose
        every candidate diverged (a model that reads nothing at this length)."""
        best = self.best
        if best is not None:
            return best
        if not any(record.final for record in self.records.values()):
            why = NOT_SCORED_YET
        elif self.finished:
            why = "the search ended with no candidate of finite score; check the model and the data"
        else:
            why = "every candidate scored so far has a non-finite NLL; check the model and the data"
        raise RunStoreError(f"{self.run_dir.file(HISTORY)}: {why}")

    @property
    def finished(self) -> bool:
        return bool(self.state and self.state.finished)

    @property
    def progress(self) -> SearchProgress | None:
        """Where the search stands (None: no generation has ended yet)."""
        return None if self.state is None else self.state.progress

    @property
    def last_generation(self) -> int:
        """The run's last generation (`last_generation`)."""
        return last_generation(self.config, self.state)

    @property
    def generation_done(self) -> int | None:
        """The last generation whose every candidate is scored (0: the initial population); None before that."""
        done = self.progress.generation if self.state else 0
        return done - 1 if done else None


def last_generation(config: JobConfig, state: RunState | None) -> int:
    """A run's last generation, numbered as the search numbers them: 0 is the initial population, so a
    20-generation run ends at generation 20 (CMA-ES: as many as its evaluation budget gives)."""
    total = state.total_generations if state and state.total_generations else None
    return (total or 1 + config.search.generations) - 1


def read_run(run_dir: RunDir) -> CheckedRun:
    """The run directory's files, each checked against the others; RunStoreError (one line, naming the file that
    disagrees) otherwise. Writes nothing."""
    config = run_dir.read_config()
    # a dangling link is a damaged job.json, not a missing one
    job = _checked_job(run_dir, config) if os.path.lexists(run_dir.file(JOB_FILE)) else None
    history = run_dir.load_history()
    state_model = run_dir.read_state()
    _check_history(run_dir, config, job, history)
    _check_state(run_dir, config, state_model, history.records)
    return CheckedRun(run_dir, config, job, state_model, history)


# ---- job.json against config.json ----


def _checked_job(run_dir: RunDir, config: JobConfig) -> JobRecord:
    job = read_job_record(run_dir)
    where = run_dir.file(JOB_FILE)
    if problem := _other_run(job.config_hash, run_dir.config_hash()):
        raise RunStoreError(f"{where}: {problem}")
    for name, expected in _job_fields_fixed_by(config, job).items():
        if expected is not None and getattr(job, name) != expected:
            raise RunStoreError(
                f"{where}: {name} is {getattr(job, name)!r}, but config.json says {expected!r} (edited by hand, or "
                "copied from another run?)"
            )
    count, length = _windows_of(config, job)
    if job.search_windows.count != count or job.search_windows.tokens != length + 1:
        raise RunStoreError(
            f"{where}: search_windows is {job.search_windows.count} windows of {job.search_windows.tokens} tokens, "
            f"but config.json gives {count} of {length + 1}"
        )
    return job


def _job_fields_fixed_by(config: JobConfig, job: JobRecord) -> dict[str, Any]:
    """job.json's fields that config.json fixes (None: the config leaves it to the model)."""
    model = None if config.model.is_reference else str(config.model.directory())
    return {
        "target_length": config.target_length,
        "original_length": config.original_length,
        "factor": config.search.factor,
        "model_dir": model,
    }


def _windows_of(config: JobConfig, job: JobRecord) -> tuple[int, int]:
    """(count, positions) of the search windows: `data.search_windows` per objective, each read at the target
    length (a short-factor search: at original_length)."""
    count = config.data.search_windows * len(config.data.objective_weights())
    return count, job.original_length if job.factor == "short" else job.target_length


# ---- history.jsonl against job.json and config.json ----


def _check_history(run_dir: RunDir, config: JobConfig, job: JobRecord | None, history: History) -> None:
    """Each line against config.json and, once it is written, job.json (a run that lost job.json is checked
    against its config alone: a resume writes job.json again)."""
    mix = ObjectiveMix.of(config.data.objective_weights(), config.data.search_windows)
    count = len(mix.objectives)
    length = _windows_of(config, job)[1] if job else config.target_length
    lines = history.line_numbers()
    reference_tokens = max((r.tokens for r in history.records.values()), key=len, default=[])
    for key, record in history.records.items():
        where = f"{run_dir.file(HISTORY)}:{lines.get(key, '?')}"
        problem = _record_problem(record, config, job, mix, count, length, reference_tokens)
        if problem:
            raise RunStoreError(f"{where}: {problem}; the line does not belong to this run")


def _record_problem(record, config, job, mix, count, length, reference_tokens) -> str | None:
    """What makes a (self-consistent) history record disagree with its run; None if nothing does."""
    factors, nll, tokens = record.factors, record.nll, record.tokens
    status = record.status
    if job is not None and len(factors) != job.pairs:
        return f"{len(factors)} factors, but the model has {job.pairs} rotary pairs (job.json: head_dim {job.head_dim})"
    if any(b < a - MONOTONE_TOLERANCE for a, b in itertools.pairwise(factors)):
        return "factors decrease across pairs (every candidate of the search is non-decreasing)"
    if record.gradient_windows is not None:
        problem = _step_problem(record, config, count)
        if problem:
            return problem
    if job is not None and record.windows is not None and record.windows != job.search_windows_hash:
        return f"scored on other windows (hash {record.windows}, job.json's {job.search_windows_hash})"
    if (status == "scored" and len(nll) != count) or len(nll) > count:
        return f"{len(nll)} window NLLs for a {status} candidate, but the run has {count} search windows"
    if tokens != reference_tokens[: len(tokens)] or max(tokens, default=0) > length:
        return f"token counts {tokens[:4]}... differ from the other candidates' on the same windows"
    if not config.search.n_hat.enabled and record.n_hat != 0:
        return f"n_hat {record.n_hat}, but the run does not search n_hat"
    if record.n_hat and record.n_hat not in config.search.n_hat.choices:
        return f"n_hat {record.n_hat} is not one of search.n_hat.choices {list(config.search.n_hat.choices)}"
    if status == "scored" and record.mean_nll is not None:
        if any(v is None for v in nll):
            return "a finite mean_nll from a window without a finite NLL"
        expected = mix.mean_nll(nll, tokens)
        if not math.isclose(record.mean_nll, expected, rel_tol=1e-9, abs_tol=1e-12):
            return f"mean_nll {record.mean_nll!r}, but its per-window NLLs give {expected!r} ({mix.describe()})"
    return None


def _step_problem(record: HistoryRecord, config: JobConfig, count: int) -> str | None:
    """A descent step's gradient windows against the run: only gradient and hybrid runs take steps, and a step's
    backward pass reads one block of the gradient windows (`WindowSplit`: never a held-out one), the gradient
    optimizer's step k the k-th block."""
    optimizer, windows = config.search.optimizer, record.gradient_windows
    if not search_plan(config.search, 0).backward_steps:
        return f"a descent step (gradient_windows {windows}) in a {optimizer!r} run, which takes none"
    split = WindowSplit.of(config.search.gradient, count)
    blocks = [list(split.block(step)) for step in range(1, math.ceil(split.gradient / split.per_step) + 1)]
    step = record.generation
    expected = list(split.block(max(step, 1)))  # the gradient optimizer's step k reads block k
    steps_are_generations = searcher_class(optimizer).descent_steps(config.search) is not None
    if steps_are_generations and windows != expected:
        return f"gradient_windows {windows}, but step {step} reads {expected}"
    if windows not in blocks:
        held_out = list(split.held_out)
        return f"gradient_windows {windows} is no block of the run's gradient windows {blocks} (held out {held_out})"
    return None


# ---- state.json against config.json and history.jsonl ----


def _check_state(run_dir: RunDir, config: JobConfig, state: RunState | None, records: Records) -> None:
    where = run_dir.file(STATE)
    if state is None:
        later = [r.generation for r in records.values() if r.generation > 0]
        if later:
            raise RunStoreError(
                f"{where}: missing, but history.jsonl holds candidates of generation {max(later)} (state.json is "
                "written when generation 0 ends); the run directory is damaged"
            )
        return
    problem = _state_problem(config, run_dir.config_hash(), state)
    if problem:
        raise RunStoreError(f"{where}: {problem}")
    _check_progress(run_dir, state.progress.generation, records)
    if config.search.schedule == "steady":  # the one searcher whose own state state.json holds
        if state.searcher is None:
            raise RunStoreError(f"{where}: optimizer.state is null, but a steady search keeps its state here")
        check_steady_state(run_dir, state, records)


def _state_problem(config: JobConfig, config_hash: str, state: RunState) -> str | None:
    """What makes state.json disagree with config.json; None if nothing does."""
    kind = state.optimizer.kind
    if problem := _other_run(state.config_hash, config_hash):
        return problem
    if kind != config.search.optimizer:
        return f"holds a {kind!r} optimizer, but config.json says {config.search.optimizer!r}"
    low, high = searcher_class(kind).generations_range(config.search)
    total = state.total_generations
    if total is not None and not low <= total <= high:
        expected = str(low) if low == high else f"{low} to {high}"
        return f"total_generations is {total}, but config.json gives {expected} (generation 0 included)"
    return None


def _other_run(stored_hash: str | None, config_hash: str) -> str | None:
    """A job.json or state.json stamped with another run's config hash (copied from another run directory);
    None for this run's, or a file not stamped."""
    if stored_hash is None or stored_hash == config_hash:
        return None
    return (
        f"belongs to another run (config hash {stored_hash}, config.json's {config_hash}); was it copied from "
        "another run directory?"
    )


def _check_progress(run_dir: RunDir, generation: int, records: Records) -> None:
    """state.json's generation against the history: a generation done means scored candidates, and no candidate
    is of a generation not yet asked (state.json is written whenever candidates go out)."""
    if generation > 0 and not any(r.final for r in records.values()):
        raise RunStoreError(
            f"{run_dir.file(HISTORY)}: holds no scored candidate, but state.json has reached generation "
            f"{generation}; the run directory is damaged"
        )
    ahead = [r.generation for r in records.values() if r.generation > generation]
    if ahead:
        raise RunStoreError(
            f"{run_dir.file(HISTORY)}: holds candidates of generation {max(ahead)}, but state.json has reached "
            f"generation {generation} (a state.json from earlier in the run, or another run's?)"
        )


def check_steady_state(run_dir: RunDir, state: RunState, records: Records) -> None:
    """A steady GA's state (the one searcher state state.json holds: its parents depend on arrival order, which no
    replay recovers) against history.jsonl, which holds its told candidates and their scores (a final record of a
    candidate not among the asks out): its parents are told candidates; otherwise the run directory is damaged,
    and every reader says so rather than go on."""
    try:
        out = set(state.searcher.out_keys())
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise RunStoreError(f"{run_dir.file(STATE)}: corrupted (pending: {exc})") from exc
    scores = {key: record.score for key, record in records.items() if record.final and key not in out}
    unknown = [key for key in state.searcher.parent_keys() if key not in scores]
    if unknown:
        raise RunStoreError(
            f"{run_dir.file(STATE)}: population holds {unknown[0]}, which history.jsonl does not hold as told (no "
            "final record, or an ask still out); the run directory is damaged"
        )
