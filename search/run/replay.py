"""A resumed searcher rebuilt from the run directory, before anything is written: the history is the record.

state.json keeps no copy of a replayed searcher's state (every optimizer but the steady GA, a `StatefulSearcher`): a
resumed run builds its searcher afresh and tells it history.jsonl's results as it asks for them, so the searcher
reaches exactly where it stood; the candidates it asked for that the history does not hold go out first. The steady
GA, whose parents depend on the order results arrived in, loads its generator, parents and asks out from state.json
instead, and what it was told from history.jsonl (`StatefulSearcher.resume`). The
replay is also the check of the history itself, done before the run's directory or workers are touched:

- each recorded candidate the search asks for again is the one recorded under its key (the same factors, to the
  6 decimals history.jsonl keeps, attention factor and gradient windows);
- once the search asks for a candidate history.jsonl does not hold, no recorded candidate of that generation or
  an earlier one is left unasked: a line the search never asked for means the results recorded before it lead
  elsewhere (an edited score or gradient), or that it came from another run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from longrope.search.optimizers.history_record import HistoryRecord, recorded_factors
from longrope.search.optimizers.searcher import Candidate, Searcher, keeps_state
from longrope.search.run.run_store import HISTORY, STATE, History, Records, RunDir, RunState, RunStoreError

ASK_ALL = 1 << 20  # a replay asks for everything a searcher hands out at once (a generational one ignores counts)


@dataclass(frozen=True)
class Outstanding:
    """What a resumed searcher had asked for and not been told of (out when the run stopped), and how many
    candidates it asked for with them: the generation's size, which decides the ranges each goes out in (the
    coordinator's `_spread`), so a resumed run sends them as the uninterrupted one did. 0: their own count."""

    candidates: list[Candidate] = field(default_factory=list)
    asked: int = 0


def rebuild(run_dir: RunDir, searcher: Searcher, state: RunState | None, history: History) -> Outstanding:
    """Bring a fresh `searcher` to where the run stood: state.json's state with history.jsonl's final lines for a
    searcher that does not replay, else a replay of the history; one RunStoreError (the run directory is damaged)
    otherwise. Returns the candidates it had asked for and not been told of (out when the run stopped: the
    coordinator sends them first), with their generation's size. Writes nothing."""
    if not keeps_state(searcher):
        return replay(run_dir, searcher, history.records)
    if state is None:
        return Outstanding()  # killed before generation 0 ended: the fresh searcher asks for it again
    if state.searcher is None:
        raise RunStoreError(f"{run_dir.file(STATE)}: optimizer.state is null, but a steady search resumes from it")
    try:
        searcher.resume(state.searcher, [line for line in history.lines if line.final])
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise RunStoreError(
            f"{run_dir.file(STATE)}: the steady search's state does not rebuild with history.jsonl's lines ({exc}); "
            "the run directory is damaged"
        ) from exc
    return Outstanding(searcher.outstanding())


def replay(run_dir: RunDir, searcher: Searcher, records: Records) -> Outstanding:
    """Tell a fresh `searcher` the recorded result of each candidate it asks for, as far as history.jsonl goes;
    returns those it asked for that history.jsonl does not hold as final. RunStoreError (one line) when a recorded
    line is not what the search asks for, or the search never asks for one. Writes nothing."""
    asked: set[str] = set()
    missing: list[Candidate] = []
    batch_size = 0
    frontier = math.inf  # the generation of the first candidate the history does not hold
    while not searcher.done():
        batch = searcher.ask(ASK_ALL)
        if not batch:
            break
        asked.update(candidate.key for candidate in batch)
        batch_size = len({candidate.key for candidate in batch})
        missing = [candidate for candidate in batch if not _told_from(run_dir, searcher, candidate, records)]
        if missing:
            frontier = max(candidate.generation for candidate in missing)
            break
    stray = [r for r in records.values() if r.final and r.generation <= frontier and r.key not in asked]
    if stray:
        raise RunStoreError(
            f"{run_dir.file(HISTORY)}: candidate {stray[0].key} (generation {stray[0].generation}) is one the search "
            "never asked for (the results recorded before it lead elsewhere: an edited line, or a line of another "
            "run?); the run directory is damaged"
        )
    return Outstanding(missing, batch_size if missing else 0)


def _told_from(run_dir: RunDir, searcher: Searcher, candidate: Candidate, records: Records) -> bool:
    """Tell `candidate` its recorded result, if history.jsonl holds a final one (checked to be that candidate's)."""
    record = records.get(candidate.key)
    if record is None or not record.final:
        return False
    check_replayed(run_dir, candidate, record)
    searcher.tell([record])
    return True


def check_replayed(run_dir: RunDir, candidate: Candidate, record: HistoryRecord) -> None:
    """The recorded result told in place of scoring `candidate` is that candidate's: the same factors (recorded to
    6 decimals), attention factor (when the candidate sets one) and gradient windows."""
    factors = recorded_factors(candidate.factors)
    attention, recorded = candidate.attention_factor, record.attention_factor
    moved = attention is not None and (recorded is None or not math.isclose(attention, recorded))
    windows = None if candidate.gradient_windows is None else list(candidate.gradient_windows)
    if factors != record.factors or moved or (record.status == "scored" and record.gradient_windows != windows):
        raise RunStoreError(
            f"{run_dir.file(HISTORY)}: candidate {record.key} is recorded with other factors, attention factor or "
            "gradient windows than the search asks for under that key (an edited line, or a line of another run?); "
            "the run directory is damaged"
        )
