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
- state.json: the config it belongs to, the optimizer the config names, its generation counts, and a final
  record with the same score in history.jsonl for every candidate it counts as told;
- a descent's state (gradient; a hybrid's polish): what history.jsonl's lines give when the descent is replayed
  on them (`_check_descents`), and every descent step in history.jsonl one the descent asked for.

status, export, compare and verify (run directories as factors), seeds from a run and `--resume` all read a run
through `read_run`, so one directory gets one verdict. It writes nothing.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from longrope.search.config.job_config import JobConfig
from longrope.search.optimizers.evolution import told_from_json
from longrope.search.optimizers.genome import GenomeGrid, Seed
from longrope.search.optimizers.gradient import GradientDescent, WindowSplit, replay
from longrope.search.optimizers.hybrid import polish_descent
from longrope.search.optimizers.objective import ObjectiveMix
from longrope.search.run.job_record import JOB_FILE, JobRecord, read_job_record
from longrope.search.run.run_store import (
    FINAL_STATUSES,
    HISTORY,
    STATE,
    EvolutionState,
    History,
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
    def records(self) -> dict[str, dict[str, Any]]:
        return self.history.records

    @property
    def best(self) -> dict[str, Any] | None:
        return best_of(self.records)

    @property
    def finished(self) -> bool:
        return bool(self.state and self.state.finished)

    @property
    def last_generation(self) -> int:
        """The run's last generation, numbered as the search numbers them: 0 is the initial population, so a
        20-generation run ends at generation 20 (CMA-ES: as many as its evaluation budget gives)."""
        total = self.state.total_generations if self.state and self.state.total_generations else None
        return (total or 1 + self.config.search.generations) - 1

    @property
    def generation_done(self) -> int | None:
        """The last generation whose every candidate is scored (0: the initial population); None before that."""
        done = self.state.evolution.generation if self.state else 0
        return done - 1 if done else None


def read_run(run_dir: RunDir) -> CheckedRun:
    """The run directory's files, each checked against the others; RunStoreError (one line, naming the file that
    disagrees) otherwise. Writes nothing."""
    config = run_dir.read_config()
    job = _checked_job(run_dir, config) if _exists(run_dir, JOB_FILE) else None
    history = run_dir.load_history()
    state = run_dir.read_state()
    state_model = RunState.model_validate(state) if state is not None else None
    _check_history(run_dir, config, job, history)
    _check_state(run_dir, config, state_model, history.records)
    _check_descents(run_dir, config, job, state_model, history.records)
    return CheckedRun(run_dir, config, job, state_model, history)


def _exists(run_dir: RunDir, name: str) -> bool:
    path = run_dir.file(name)
    return path.exists() or path.is_symlink()  # a dangling link is a damaged file, not a missing one


# ---- job.json against config.json ----


def _checked_job(run_dir: RunDir, config: JobConfig) -> JobRecord:
    job = read_job_record(run_dir)
    where = run_dir.file(JOB_FILE)
    if job.config_hash is not None and job.config_hash != config.hash():
        raise RunStoreError(
            f"{where}: belongs to another run (config hash {job.config_hash}, config.json's {config.hash()}); "
            "was it copied from another run directory?"
        )
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
    lines = _line_numbers(run_dir)
    reference_tokens = max((r["tokens"] for r in history.records.values()), key=len, default=[])
    for key, record in history.records.items():
        where = f"{run_dir.file(HISTORY)}:{lines.get(key, '?')}"
        problem = _record_problem(record, config, job, mix, count, length, reference_tokens)
        if problem:
            raise RunStoreError(f"{where}: {problem}; the line does not belong to this run")


def _record_problem(record, config, job, mix, count, length, reference_tokens) -> str | None:
    """What makes a (self-consistent) history record disagree with its run; None if nothing does."""
    factors, nll, tokens = record["factors"], record["nll"], record["tokens"]
    status = record.get("status", "scored")
    if job is not None and len(factors) != job.pairs:
        return f"{len(factors)} factors, but the model has {job.pairs} rotary pairs (job.json: head_dim {job.head_dim})"
    if any(b < a - MONOTONE_TOLERANCE for a, b in itertools.pairwise(factors)):
        return "factors decrease across pairs (every candidate of the search is non-decreasing)"
    if record.get("gradient_windows") is not None:
        problem = _step_problem(record, config, count)
        if problem:
            return problem
    if job is not None and record.get("windows") is not None and record["windows"] != job.search_windows_hash:
        return f"scored on other windows (hash {record['windows']}, job.json's {job.search_windows_hash})"
    if (status == "scored" and len(nll) != count) or len(nll) > count:
        return f"{len(nll)} window NLLs for a {status} candidate, but the run has {count} search windows"
    if tokens != reference_tokens[: len(tokens)] or max(tokens, default=0) > length:
        return f"token counts {tokens[:4]}... differ from the other candidates' on the same windows"
    if not config.search.n_hat.enabled and record["n_hat"] != 0:
        return f"n_hat {record['n_hat']}, but the run does not search n_hat"
    if record["n_hat"] and record["n_hat"] not in config.search.n_hat.choices:
        return f"n_hat {record['n_hat']} is not one of search.n_hat.choices {list(config.search.n_hat.choices)}"
    if status == "scored" and record["mean_nll"] is not None:
        if any(v is None for v in nll):
            return "a finite mean_nll from a window without a finite NLL"
        expected = mix.mean_nll(nll, tokens)
        if not math.isclose(record["mean_nll"], expected, rel_tol=1e-9, abs_tol=1e-12):
            return f"mean_nll {record['mean_nll']!r}, but its per-window NLLs give {expected!r} ({mix.describe()})"
    return None


def _step_problem(record: dict[str, Any], config: JobConfig, count: int) -> str | None:
    """A descent step's gradient windows against the run: only gradient and hybrid runs take steps, and a step's
    backward pass reads one block of the gradient windows (`WindowSplit`: never a held-out one), the gradient
    optimizer's step k the k-th block."""
    optimizer, windows = config.search.optimizer, record["gradient_windows"]
    if optimizer not in ("gradient", "hybrid"):
        return f"a descent step (gradient_windows {windows}) in a {optimizer!r} run, which takes none"
    split = WindowSplit.of(config.search.gradient, count)
    blocks = [list(split.block(step)) for step in range(1, math.ceil(split.gradient / split.per_step) + 1)]
    step = record["generation"]
    if optimizer == "gradient" and windows != list(split.block(max(step, 1))):
        return f"gradient_windows {windows}, but step {step} reads {list(split.block(max(step, 1)))}"
    if windows not in blocks:
        held_out = list(split.held_out)
        return f"gradient_windows {windows} is no block of the run's gradient windows {blocks} (held out {held_out})"
    return None


def _line_numbers(run_dir: RunDir) -> dict[str, int]:
    """Each key's last line in history.jsonl (its record as read), to name the line an error is about."""
    numbers: dict[str, int] = {}
    try:
        text = run_dir.file(HISTORY).read_bytes()
    except OSError:
        return numbers
    for number, line in enumerate(text.splitlines(), start=1):
        start = line.find(b'"key": "')
        if start >= 0:
            numbers[line[start + 8 : line.find(b'"', start + 8)].decode(errors="replace")] = number
    return numbers


# ---- state.json against config.json and history.jsonl ----


def _check_state(
    run_dir: RunDir, config: JobConfig, state: RunState | None, records: dict[str, dict[str, Any]]
) -> None:
    where = run_dir.file(STATE)
    if state is None:
        later = [r["generation"] for r in records.values() if r["generation"] > 0]
        if later:
            raise RunStoreError(
                f"{where}: missing, but history.jsonl holds candidates of generation {max(later)} (state.json is "
                "written when generation 0 ends); the run directory is damaged"
            )
        return
    problem = _state_problem(config, state)
    if problem:
        raise RunStoreError(f"{where}: {problem}")
    check_history_holds(run_dir, state, records)


def _state_problem(config: JobConfig, state: RunState) -> str | None:
    """What makes state.json disagree with config.json; None if nothing does."""
    evolution = state.evolution
    if state.config_hash is not None and state.config_hash != config.hash():
        return (
            f"belongs to another run (config hash {state.config_hash}, config.json's {config.hash()}); was it "
            "copied from another run directory?"
        )
    if evolution.kind != config.search.optimizer:
        return f"holds a {evolution.kind!r} optimizer, but config.json says {config.search.optimizer!r}"
    low, high = _total_generations_range(config)
    total = state.total_generations
    if total is not None and not low <= total <= high:
        expected = str(low) if low == high else f"{low} to {high}"
        return f"total_generations is {total}, but config.json gives {expected} (generation 0 included)"
    if evolution.generation > (total or high):
        return f"generation {evolution.generation} is past the run's {total or high} generations"
    if len(state.generation_seconds) != evolution.generation:
        return f"{len(state.generation_seconds)} generation times for {evolution.generation} generations done"
    return None


def _total_generations_range(config: JobConfig) -> tuple[int, int]:
    """How many generations the run's optimizer makes, generation 0 included: the GA's 1 + search.generations;
    CMA-ES's 1 + ceil((budget - seeds) / samples per generation), with the number of distinct seeds between 1 and
    the seeds the config can give (a seed file from a run gives two: `JobContext.seeds_from_file`)."""
    search = config.search
    if search.optimizer == "gradient":  # the seeds, the steps, the best point rounded to the grid
        return 2 + search.gradient.steps, 2 + search.gradient.steps
    if search.optimizer != "cmaes":
        return 1 + search.generations, 1 + search.generations
    budget = search.population + (search.mutations + search.crossovers) * search.generations
    samples = search.cmaes.population or search.mutations + search.crossovers
    most_seeds = len(search.seeds) + 2 * len(search.seed_files) + 1
    return 1 + max(0, math.ceil((budget - most_seeds) / samples)), 1 + max(0, math.ceil((budget - 1) / samples))


def check_history_holds(run_dir: RunDir, state: RunState, records: dict[str, dict[str, Any]]) -> None:
    """Every candidate state.json counts as told has a final record in history.jsonl (the one source of truth for
    scores and the best) with the score state.json holds for it, and the records are of generations the state
    has reached; otherwise the run directory is damaged, and every reader says so rather than go on."""
    try:
        _, scores = told_from_json(state.evolution.told)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise RunStoreError(f"{run_dir.file(STATE)}: corrupted (told: {exc})") from None
    lost = [key for key in scores if records.get(key, {}).get("status", "scored") not in FINAL_STATUSES]
    lost += [key for key in scores if key not in records]
    if lost:
        raise RunStoreError(
            f"{run_dir.file(HISTORY)}: lacks {len(lost)} of the {len(scores)} candidates "
            f"that state.json counts as scored (first {lost[0]}, no final record); the run directory is damaged"
        )
    for key, score in scores.items():
        recorded = records[key].get("mean_nll")
        if recorded is not None and recorded != score:
            raise RunStoreError(
                f"{run_dir.file(STATE)}: candidate {key} told with score {score!r}, but history.jsonl holds "
                f"{recorded!r} (copied from another run?); the run directory is damaged"
            )
    unknown = [key for key in state.evolution.population if key not in scores]
    if unknown:
        raise RunStoreError(f"{run_dir.file(STATE)}: population holds {unknown[0]}, which was never told")
    generation = state.evolution.generation
    ahead = [r["generation"] for r in records.values() if r["generation"] > generation]
    if ahead:
        raise RunStoreError(
            f"{run_dir.file(HISTORY)}: holds candidates of generation {max(ahead)}, but state.json has reached "
            f"generation {generation} (a state.json from earlier in the run, or another run's?)"
        )


# ---- a descent's state against history.jsonl ----

REPLAY_TOLERANCE = 1e-9  # relative: the replay runs the same code on the same values, so only a foreign libm differs


def _check_descents(
    run_dir: RunDir, config: JobConfig, job: JobRecord | None, state: RunState | None, records: dict[str, dict]
) -> None:
    """A gradient run's descent, or a hybrid's polish in progress, is what its lines in history.jsonl give
    (`gradient.replay`), and history.jsonl holds no step it did not ask for. Needs the run's grid, which needs the
    model's lengths: without job.json (lost, or not written yet) the state is only typed-checked (`RunState`)."""
    optimizer = config.search.optimizer
    if state is None or job is None or optimizer not in ("gradient", "hybrid"):
        return
    grid = GenomeGrid(config.search, pairs=job.pairs, scale=job.target_length / job.original_length)
    mix = ObjectiveMix.of(config.data.objective_weights(), config.data.search_windows)
    if optimizer == "gradient":
        seeds = [
            Seed(r["seed"] or key, np.asarray(r["factors"]), r["attention_factor"])
            for key, r in records.items()
            if r["generation"] == 0 and r.get("status", "scored") == "scored"
        ]
        descent = GradientDescent(config.search.gradient, grid, seeds, mix)
        _check_replay(run_dir, "evolution", descent, state.evolution, records, list(records))
    else:
        _check_polish(run_dir, config, grid, mix, state.evolution, records)


def _check_polish(
    run_dir: RunDir, config: JobConfig, grid: GenomeGrid, mix: ObjectiveMix, evolution: EvolutionState, records
) -> None:
    """The hybrid's polishes: the steps of a polish carry the generation the evolution was at (the one after the
    generation polished). A finished polish (after a generation up to polished_through) has all its steps; the
    polish after the last generation done, when that is past polished_through, is replayed from the evolution's
    best; `polish` is there only while one is under way."""
    where, current = run_dir.file(STATE), evolution.generation
    done, through, steps = current - 1, evolution.polished_through, config.search.gradient.polish_steps
    if through > max(done, 0):
        raise RunStoreError(f"{where}: evolution.polished_through is {through}, past generation {done}, the last done")
    if evolution.polish is not None and through >= done:
        raise RunStoreError(
            f"{where}: evolution.polish holds a polish under way, but polished_through {through} says generation "
            f"{done}'s best is polished already"
        )
    counts = Counter(r["generation"] for r in records.values() if r.get("gradient_windows") is not None)
    for generation, count in sorted(counts.items()):
        if generation == current and through < done:
            continue  # the polish under way (or about to be), replayed below
        if generation - 1 > through:
            raise RunStoreError(
                f"{where}: evolution.polished_through is {through}, but history.jsonl holds polish steps after "
                f"generation {generation - 1}"
                + (" (a polish under way, and evolution.polish is null)" if generation == current else "")
            )
        if count != steps:
            raise RunStoreError(
                f"{where}: evolution.polished_through is {through}, but history.jsonl holds {count} of the "
                f"{steps} steps of the polish after generation {generation - 1} (a polish not finished?)"
            )
    if through < done:
        genomes, scores = told_from_json(evolution.told)
        best = min((key for key in scores if key in genomes), key=lambda key: (scores[key], key))
        polish = polish_descent(config.search, grid, mix, genomes[best])
        steps_now = [key for key, r in records.items() if r["generation"] == current and r.get("gradient_windows")]
        _check_replay(run_dir, "evolution.polish", polish, evolution.polish, records, steps_now)


def _check_replay(
    run_dir: RunDir,
    field: str,
    descent: GradientDescent,
    stored: EvolutionState | None,
    records: dict[str, dict],
    lines: list[str],
) -> None:
    """Each of `lines` (history keys the descent must account for) is a point the replay asked for (a stray one
    is named first: the line after an edited one is where the replay and the history part), `stored` (None: a
    polish not started, the descent as built) is the replayed descent's state at its generation, and the history
    is at most one generation ahead of it (state.json is written after each)."""
    where = run_dir.file(STATE)
    if stored is not None:
        _check_lengths(where, field, stored, descent.param.size)
    generation = descent.generation if stored is None else stored.generation
    replayed = replay(descent, records, generation)
    asked, numbers = set(replayed.keys), _line_numbers(run_dir)
    stray = [key for key in lines if key not in asked]
    if stray:
        raise RunStoreError(
            f"{run_dir.file(HISTORY)}:{numbers.get(stray[0], '?')}: a descent point the run's descent never asked for "
            "(the recorded points and gradients before it lead elsewhere: an edited gradient or point, or a line of "
            "another run?)"
        )
    if replayed.state is None:
        raise RunStoreError(
            f"{where}: {field}.generation is {generation}, but history.jsonl's lines take the descent to generation "
            f"{replayed.generation} only (lines lost, edited, or a state.json of another run?)"
        )
    if stored is not None:
        difference = _first_difference(_comparable(replayed.state), _comparable(stored.model_dump()), field)
        if difference:
            path, expected, found = difference
            raise RunStoreError(
                f"{where}: {path} is {_short(found)}, but replaying history.jsonl's points and gradients gives "
                f"{_short(expected)} (a descent's state is a function of its lines: edited, or from another run?)"
            )
    if replayed.generation > generation + 1:
        raise RunStoreError(
            f"{where}: {field}.generation is {generation}, but history.jsonl's lines take the descent to generation "
            f"{replayed.generation} (a state.json from earlier in the run?)"
        )


def _check_lengths(where, field: str, stored: EvolutionState, size: int) -> None:
    """u and Adam's moments hold one value per parameter: pairs + 1 slack logit (+ 1 for a searched attention)."""
    descent = stored.descent
    if descent is None:
        raise RunStoreError(f"{where}: {field}.descent: missing (a descent's state holds one)")
    for name, values in (("u", descent.u), ("adam.m", descent.adam.m), ("adam.v", descent.adam.v)):
        if values is not None and len(values) != size:
            raise RunStoreError(
                f"{where}: {field}.descent.{name}: {len(values)} values, but the run's descent has {size} parameters"
            )


def _comparable(state: dict[str, Any]) -> dict[str, Any]:
    """A descent's state_dict as compared: `told` as a mapping (its order is the order results arrived in), and
    only the fields a descent writes."""
    fields = ("kind", "generation", "population", "descent")
    return {**{name: state.get(name) for name in fields}, "told": {key: score for key, score in state["told"]}}


def _first_difference(expected: Any, found: Any, path: str) -> tuple[str, Any, Any] | None:
    """The first place (a dotted path, list items as [i]) where `found` differs from `expected`; numbers within
    REPLAY_TOLERANCE are equal."""
    if isinstance(expected, dict) and isinstance(found, dict):
        if set(expected) != set(found):
            return path, sorted(expected), sorted(found)
        return next((d for k in expected if (d := _first_difference(expected[k], found[k], f"{path}.{k}"))), None)
    if isinstance(expected, list | tuple) and isinstance(found, list | tuple):
        if len(expected) != len(found):
            return f"{path} ({len(found)} values)", f"{len(expected)} values", f"{len(found)} values"
        return next(
            (
                d
                for i, (e, f) in enumerate(zip(expected, found, strict=True))
                if (d := _first_difference(e, f, f"{path}[{i}]"))
            ),
            None,
        )
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (expected, found))
    if numbers and math.isclose(expected, found, rel_tol=REPLAY_TOLERANCE, abs_tol=1e-12):
        return None
    return None if expected == found and type(expected) is type(found) else (path, expected, found)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
