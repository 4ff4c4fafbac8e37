"""`longrope status RUN_DIR`: where a search stands (running, stopped and why, or finished), best vs its seeds,
and an ETA while it runs.

Whether it runs is not in state.json (which holds no times, so a killed run's reads like a live one's): it comes
from the writer's lock and heartbeat.json (`heartbeat.py`). A run nobody holds any more is "stopped", with when
and why, and the command that resumes it; it gets no ETA.
"""

from __future__ import annotations

import shlex
import statistics
import time
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from longrope.search.config.job_config import JobConfig
from longrope.search.optimizers.factory import searcher_class
from longrope.search.optimizers.history_record import HistoryRecord
from longrope.search.optimizers.labels import polish_position
from longrope.search.optimizers.searcher import PolishProgress
from longrope.search.run import heartbeat as heartbeats
from longrope.search.run.generation_log import screening_text
from longrope.search.run.job_record import JobRecord
from longrope.search.run.run_check import CheckedRun, read_run
from longrope.search.run.run_store import (
    CONFIG,
    HISTORY,
    STATE,
    RunDir,
    RunStoreError,
    final_count,
    seed_perplexities,
    window_passes,
)
from longrope.search.run.stages import stage_lengths, started_stages

KILLED = "no clean stop was recorded: killed (SIGKILL, out of memory) or its machine went down"


class RunStatus(BaseModel):
    """`longrope status RUN_DIR --json`: one run's status, as scripts read it. Fields a run cannot say yet are
    left out rather than null: its model and lengths before job.json is written, the best's attention factor
    before a finite score, `stage` outside a progressive job (`as_json`)."""

    model_config = ConfigDict(extra="forbid")

    run_dir: str
    resume_dir: str  # the directory `search --resume` takes: a progressive job's, for its stages
    name: str
    optimizer: str
    descent_steps: int | None  # a gradient run's steps; None for the others
    generation: int | None  # the last generation done (0: the initial population); None before it
    generations: int  # the run's last generation
    polish: PolishProgress | None
    evaluations: int
    forward_windows: int
    backward_windows: int
    stopped_by_racing: int
    failed: int  # candidates whose scoring raised on every worker it was tried on (ranked last)
    proposed: int | None  # the surrogate's children proposed and screened out; None when it is off
    screened_out: int | None
    finished: bool
    stopped_early: bool
    state: Literal["finished", "running", "stopped"]
    pid: int | None
    host: str | None
    heartbeat: str | None
    last_update_seconds: float | None
    stopped_at: str | None
    stop_reason: str | None
    workers: int | None  # the workers the process holding the run started (None: no heartbeat, or in-process)
    workers_busy: float | None  # their busy share of workers x wall time so far in that process (`BusyTime`)
    best_perplexity: float | None
    best_key: str | None
    seed_perplexities: dict[str, float | None]
    eta_seconds: float | None
    model: str | None = None  # job.json's model directory (None: the reference model)
    original_length: int | None = None
    target_length: int | None = None
    factor: Literal["long", "short"] | None = None
    best_attention_factor: float | None = None
    stage: str | None = None  # a progressive job's latest started stage, "2/3"

    def as_json(self) -> dict:
        """Every field set, whole (`polish` with its defaults too), none of those left out."""
        return {name: value for name, value in self.model_dump().items() if name in self.model_fields_set}


def run_status(
    run_dir: RunDir, *, now: float | None = None, host: str | None = None, stale_after_s: float | None = None
) -> RunStatus:
    """A run's status; a progressive job's is its latest started stage's, with the stage named. `now`, `host`
    and `stale_after_s` are the clock, this machine and the heartbeat age past which another host's run counts
    as dead (defaults: the real ones, heartbeat.STALE_AFTER_S). The run directory is read as `read_run` reads it
    for every command, so a damaged one gets the verdict `--resume` and `export` give it.

    Generations are numbered as the search's log numbers them: `generation` is the last one done (0: the initial
    population; None before it is done) of `generations`, the run's last (a 20-generation run: 20)."""
    now = time.time() if now is None else now
    host = heartbeats.this_host() if host is None else host
    stale_after_s = heartbeats.STALE_AFTER_S if stale_after_s is None else stale_after_s
    config = run_dir.read_config()
    if config.search.stages:
        return _staged_status(run_dir, config, now=now, host=host, stale_after_s=stale_after_s)
    run = read_run(run_dir)
    history = run.records
    life = liveness(run_dir, run.finished, now=now, host=host, stale_after_s=stale_after_s)
    polish = None if run.finished or run.progress is None else run.progress.polish  # a hybrid's polish under way
    eta = _eta_seconds(run, polish) if life["state"] == "running" else None
    best = run.best
    forward, backward = window_passes(history)
    return RunStatus(
        run_dir=str(run_dir.path),
        resume_dir=str(run_dir.path),
        name=config.name,
        optimizer=config.search.optimizer,
        descent_steps=searcher_class(config.search.optimizer).descent_steps(config.search),
        generation=run.generation_done,
        generations=run.last_generation,
        polish=polish,
        evaluations=final_count(history),
        forward_windows=forward,
        backward_windows=backward,
        stopped_by_racing=sum(1 for r in history.values() if r.status == "stopped"),
        failed=sum(1 for r in history.values() if r.status == "failed"),
        **screening_fields(run),
        finished=run.finished,
        stopped_early=bool(run.state and run.state.stopped_early),
        **life,
        best_perplexity=best.perplexity if best else None,
        best_key=best.key if best else None,
        seed_perplexities=seed_perplexities(history),
        eta_seconds=eta,
        **record_fields(run.job, best),
    )


def screening_fields(run: CheckedRun) -> dict[str, int | None]:
    """search.surrogate's counts: children `proposed` after generation 0 and of those `screened_out` before
    scoring (null when the surrogate is off)."""
    if not run.config.search.surrogate.enabled:
        return {"proposed": None, "screened_out": None}
    progress = run.progress
    return {"proposed": progress.proposed if progress else 0, "screened_out": progress.screened_out if progress else 0}


def _eta_seconds(run: CheckedRun, polish: PolishProgress | None) -> float | None:
    """The generations left at their median time (generation 0 aside: it scores a whole population), and for a
    hybrid the polish steps left (the one under way and those still due) at a polish step's median time; before
    any polish step is timed, at a GA candidate's (a step scores one candidate, and a backward pass on some of
    its windows, which this leaves out)."""
    seconds = run.state.generation_seconds if run.state else []
    if not seconds:
        return None
    per_generation = statistics.median(seconds[1:] or seconds)
    done = -1 if run.generation_done is None else run.generation_done
    eta = per_generation * (run.last_generation - done)
    if searcher_class(run.config.search.optimizer).polishes:
        search = run.config.search
        per_step = statistics.median(run.state.polish_seconds) if run.state.polish_seconds else None
        if per_step is None:
            per_step = per_generation / max(1, search.mutations + search.crossovers)
        eta += per_step * _polish_steps_left(run, polish, done)
    return eta


def _polish_steps_left(run: CheckedRun, polish: PolishProgress | None, done: int) -> int:
    """Polish steps (each polish's rounding counted as one) still to run: the rest of the one under way, and a
    whole polish after each generation still to come that is due one."""
    per_polish = run.config.search.gradient.polish_steps + 1
    now = 0 if polish is None else per_polish - polish.steps_done - polish.rounded
    later = sum(1 for g in range(done + 1, run.last_generation + 1) if _polish_due_after(run, g))
    return now + later * per_polish


def _polish_due_after(run: CheckedRun, generation: int) -> bool:
    """Whether the hybrid polishes after `generation` (`GradientConfig.polishes_after`, the rule it runs by)."""
    ending = bool(run.progress and run.progress.stopped_early)
    return run.config.search.gradient.polishes_after(generation, run.last_generation, ending)


def _staged_status(run_dir: RunDir, config: JobConfig, *, now: float, host: str, stale_after_s: float) -> RunStatus:
    """The latest started stage's status, named; between two stages the job's own lock says it still runs, and
    only the last stage's end finishes the job. The resume command names the job directory."""
    started = started_stages(run_dir)
    if not started:
        raise RunStoreError(f"{run_dir.path}: no stage has started yet")
    stages = len(stage_lengths(config))
    status = run_status(started[-1], now=now, host=host, stale_after_s=stale_after_s)
    named = {"stage": f"{len(started)}/{stages}", "resume_dir": str(run_dir.path)}
    if status.state != "running" and run_dir.lock_held():
        named |= {"state": "running", "stopped_at": None, "stop_reason": None}
    elif status.state == "finished" and len(started) < stages:
        ended = now - (status.last_update_seconds or 0.0)
        named |= {"state": "stopped", "stopped_at": _iso(ended), "stop_reason": f"after stage {len(started)}"}
    return status.model_copy(update=named)


def liveness(run_dir: RunDir, finished: bool, *, now: float, host: str, stale_after_s: float) -> dict[str, Any]:
    """`RunStatus`'s liveness fields: the run's state, finished, running (the lock is held, or the heartbeat says
    so credibly: see `heartbeat.is_alive`) or stopped; who wrote the heartbeat, how long ago, and for a stopped run
    when and why it stopped."""
    beat = heartbeats.read_heartbeat(run_dir.file(heartbeats.HEARTBEAT))
    alive = heartbeats.is_alive(beat, run_dir.lock_held(), now=now, host=host, stale_after_s=stale_after_s)
    state = "finished" if finished else "running" if alive else "stopped"
    if state != "stopped":
        stopped_at = stop_reason = None
    else:
        stopped_at = _iso(beat.updated_at if beat else _last_write(run_dir))
        stop_reason = (beat.stop_reason if beat.state == "stopped" else KILLED) if beat else None
    return {
        "state": state,
        "pid": beat.pid if beat else None,
        "host": beat.host if beat else None,
        "heartbeat": beat.state if beat else None,
        "last_update_seconds": max(0.0, now - beat.updated_at) if beat else None,
        "stopped_at": stopped_at,
        "stop_reason": stop_reason,
        "workers": beat.busy.workers if beat and beat.busy else None,
        "workers_busy": beat.busy.fraction if beat and beat.busy else None,
    }


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).astimezone().isoformat(timespec="seconds")


def _last_write(run_dir: RunDir) -> float:
    """When a run without a heartbeat (lost, or killed before it wrote one) last wrote anything: its stop time,
    as near as known."""
    times = [run_dir.file(name).stat().st_mtime for name in (STATE, HISTORY, CONFIG) if run_dir.file(name).exists()]
    return max(times)


def record_fields(job: JobRecord | None, best: HistoryRecord | None) -> dict[str, str | int | float | None]:
    """What job.json says about the run: its model and lengths, and the best candidate as the encoding it was
    scored with (its attention factor; a short-factor run's kept one). Empty before job.json is written."""
    if job is None:
        return {}
    fields: dict[str, str | int | float | None] = {
        "model": job.model_dir,
        "original_length": job.original_length,
        "target_length": job.target_length,
        "factor": job.factor,
    }
    if best is not None:
        fields["best_attention_factor"] = job.candidate(best).attention_factor
    return fields


def format_status(status: RunStatus) -> str:
    stage = f" (stage {status.stage})" if status.stage else ""
    screened = (status.proposed, status.screened_out)
    lines = [
        f"run {status.name} in {status.run_dir}{stage}",
        f"  {_generations_text(status)}, {status.evaluations} evaluations ({status.forward_windows} forward "
        f"and {status.backward_windows} backward window passes)"
        + (f" ({status.stopped_by_racing} stopped by racing)" if status.stopped_by_racing else "")
        + (f" ({status.failed} failed)" if status.failed else "")
        + ("; " + screening_text(screened).strip() if status.proposed else ""),
        f"  {state_text(status)}",
    ]
    if status.workers_busy is not None:
        busy = f"{100 * status.workers_busy:.0f}% of the time"
        lines.append(f"  workers busy {busy} ({status.workers} workers, in the run's latest process)")
    if status.target_length is not None:  # job.json is written
        lines.append(
            f"  {status.original_length} -> {status.target_length} tokens ({status.factor} factors), "
            f"model {status.model}"
        )
    if status.best_perplexity is not None:
        attention = status.best_attention_factor
        scale = f", attention factor {attention:.4f}" if attention is not None else ""
        lines.append(f"  best perplexity {status.best_perplexity:.4f} (candidate {status.best_key}{scale})")
    for name, ppl in sorted(status.seed_perplexities.items(), key=lambda item: item[1] or float("inf")):
        gain = f"  best is {100 * (1 - status.best_perplexity / ppl):.1f}% lower" if ppl else ""
        lines.append(f"  seed {name:12s} perplexity {ppl:.4f}{gain}" if ppl else f"  seed {name:12s} diverged")
    return "\n".join(lines)


def _generations_text(status: RunStatus) -> str:
    """The optimizer, and generations numbered as the search's log numbers them: 0 is the initial population (a
    gradient run's: its seeds, then one generation per step and one for the rounding to the grid); a hybrid's
    polish under way, where it stands."""
    done, last, steps = status.generation, status.generations, status.descent_steps
    optimizer = f"{status.optimizer}: "
    if steps is not None:
        meaning = f"0 the seeds, 1-{steps} descent steps, {steps + 1} the best point rounded to the grid"
    else:
        meaning = "generation 0 is the initial population"
    if done is None:
        return f"{optimizer}generation 0/{last} not done yet ({meaning})"
    text = f"{optimizer}generation {done}/{last} done ({meaning})"
    return text + (f"; {_polish_text(status.polish)}" if status.polish else "")


def _polish_text(polish: PolishProgress) -> str:
    """A hybrid's polish between two generations: its steps done and what comes next (or its rounded best, not
    yet adopted into the population)."""
    where = polish_position(polish.steps_done, polish.steps, polish.rounded)
    after = f"the polish after generation {polish.after_generation}"
    if polish.rounded:
        return f"{after}: {where}, not yet adopted"
    return f"{after}: {polish.steps_done}/{polish.steps} steps done, next {where}"


def state_text(status: RunStatus) -> str:
    """finished / running (who, how recently, ETA) / stopped (when, why, and how to go on)."""
    if status.state == "finished":
        return "finished" + (" (stopped early: no improvement)" if status.stopped_early else "")
    if status.state == "running":
        eta = f", ETA {status.eta_seconds / 60:.1f} min" if status.eta_seconds is not None else ""
        if status.heartbeat != "running":  # the lock is held, the new holder has not written its heartbeat yet
            return f"running (starting){eta}"
        return f"running (pid {status.pid} on {status.host}, last update {_ago(status.last_update_seconds)}){eta}"
    reason = f" ({status.stop_reason})" if status.stop_reason else ""
    stopped_at = status.stopped_at.replace("T", " ")
    return f"stopped at {stopped_at}{reason}; resume with `longrope search --resume {shlex.quote(status.resume_dir)}`"


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"
