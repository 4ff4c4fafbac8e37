"""Progress for long work on the command line: a live bar with an ETA on a terminal, plain lines when piped.

A search runs for hours and `compare` for minutes to hours; both show how far they are and when they will end.
On a terminal that is rich's live bar; elsewhere (nohup, `ray job logs`, CI) a live bar would be printed once, at
the end, so plain lines take its place.

The numbers are what the bar is for, so they never shrink: rich shrinks every column of a too-narrow table alike
(`53/… evaluations … 0:0… ETA 0:00…` at 80 columns), so here the numbers are one piece of text in the longest
wording that fits (`StatsColumn`) and the bar graphic alone takes what is left of the line.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column
from rich.text import Text

MIN_BAR = 8  # columns the bar graphic keeps before the wording gets shorter
ETA_WINDOW_S = 600.0  # results arrive in bursts (a generation, a window set): the rate is taken over this long

Wording = Callable[[Task, str], str]  # (task, "elapsed ETA remaining") -> the text


class StatsColumn(ProgressColumn):
    """The task's numbers as one text, in the first of `wordings` (longest first) that leaves the bar MIN_BAR
    columns on this console; the last one is used whatever the width."""

    def __init__(self, console: Console, label: str, wordings: Sequence[Wording]):
        super().__init__(table_column=Column(no_wrap=True))
        self.console, self.label, self.wordings = console, label, wordings

    def render(self, task: Task) -> Text:
        times = f"{_plain(TimeElapsedColumn(), task)} ETA {_plain(TimeRemainingColumn(), task)}"
        room = self.console.width - len(self.label) - MIN_BAR - 2  # two column gaps
        texts = [wording(task, times) for wording in self.wordings]
        return Text(next((text for text in texts if len(text) <= room), texts[-1]))


def _plain(column: ProgressColumn, task: Task) -> str:
    return column.render(task).plain


class LiveProgress(Progress):
    """A label, a bar that takes the rest of the line, and a StatsColumn; drawn only on a terminal."""

    def __init__(self, console: Console, label: str, wordings: Sequence[Wording], *, disable: bool):
        super().__init__(
            TextColumn(f"[bold]{label}"),
            BarColumn(bar_width=None, table_column=Column(ratio=1)),
            StatsColumn(console, label, wordings),
            console=console,
            disable=disable,
            expand=True,
            speed_estimate_period=ETA_WINDOW_S,
        )


class SearchProgress(LiveProgress):
    """The search's bar: evaluations done / expected (the initial population included), the best perplexity on
    the search split so far, evaluations per second, time elapsed and an ETA (rich's, over ETA_WINDOW_S)."""

    WORDINGS: tuple[Wording, ...] = (
        lambda t, times: (
            f"{_count(t)} evaluations  best search ppl {t.fields['best']}  {t.fields['rate']} eval/s  " + times
        ),
        lambda t, times: f"{_count(t)}  ppl {t.fields['best']}  {t.fields['rate']}/s  {times}",
        lambda t, times: f"{_count(t)}  {times}",
    )

    def __init__(self, console: Console, *, disable: bool):
        super().__init__(console, "search", self.WORDINGS, disable=disable)
        self.started = time.monotonic()
        self.counted = 0

    def add_task(self, description: str, **kwargs) -> int:
        kwargs.setdefault("best", "-")
        kwargs.setdefault("rate", "-")
        return super().add_task(description, **kwargs)

    def update(self, task_id, **kwargs) -> None:
        self.counted += int(kwargs.get("advance", 0))
        kwargs["rate"] = f"{self.counted / max(time.monotonic() - self.started, 1e-9):.2f}"
        super().update(task_id, **kwargs)


def _count(task: Task) -> str:
    return f"{int(task.completed)}/{int(task.total or 0)}"


class CountProgress:
    """Progress of work counted in results, in phases (compare: the NTK settings tried, then methods x window
    sets): a live bar per phase with an ETA on a terminal; off one, a plain line each time another `step` of a
    phase's total is done (and at its end), with the elapsed time and an ETA from the phase's mean rate so far.
    Called with (phase, done, total) after each result; a context manager around the work."""

    WORDINGS: tuple[Wording, ...] = (
        lambda t, times: f"{_count(t)} {t.description}  {times}",
        lambda t, times: f"{_count(t)}  {times}",
    )

    def __init__(self, console: Console, label: str, *, step: float = 0.1):
        self.console, self.label, self.step = console, label, step
        self.bar = LiveProgress(console, label, self.WORDINGS, disable=not console.is_terminal)
        self.phases: dict[str, _Phase] = {}

    def __enter__(self) -> CountProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.stop()

    def __call__(self, phase: str, done: int, total: int) -> None:
        if phase not in self.phases:
            self.phases[phase] = _Phase(self.bar.add_task(phase, total=total), time.monotonic())
        state = self.phases[phase]
        self.bar.update(state.task, completed=done, total=total)
        if self.bar.disable and (done >= total or done / total >= state.reported + self.step):
            state.reported = done / total
            self.console.print(self._line(phase, state, done, total), soft_wrap=True, markup=False, highlight=False)

    def _line(self, phase: str, state: _Phase, done: int, total: int) -> str:
        elapsed = time.monotonic() - state.started
        left = f", ETA {_clock(elapsed / done * (total - done))}" if 0 < done < total else ""
        return f"{self.label}: {done}/{total} {phase} ({100 * done / total:.0f}%), {_clock(elapsed)} elapsed{left}"


@dataclass
class _Phase:
    task: int
    started: float
    reported: float = 0.0  # the share of the total the last plain line reported


def _clock(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
