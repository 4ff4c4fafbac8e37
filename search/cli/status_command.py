"""`longrope status RUN_DIR...`: where each search stands; `--plot [FILE]` also draws their progress, the best search
perplexity against the window-equivalents spent, every run on one axis (`reports/progress_plot.py`).

Light: without --plot it imports neither matplotlib, torch nor Ray; --plot adds matplotlib only.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from longrope.search.cli.console import cli_console
from longrope.search.cli.estimate_command import job_backward_cost
from longrope.search.config.strict import JobConfigError
from longrope.search.export.output_paths import check_output_path
from longrope.search.reports.status import RunStatus, format_status, run_status
from longrope.search.run.run_store import RunDir
from longrope.workers.errors import ModelLoadError
from longrope.workers.path_limits import shown_path
from longrope.workers.user_files import repeated_path

PLOT_FILE = "progress.png"
# the most --backward-cost takes: a backward pass costs about 2 forwards in FLOPs (3 with activations recomputed);
# past 100 the plot's x axis would be the backward passes alone, and a value like 1e308 a typo
MAX_BACKWARD_COST = 100.0
DEFAULT_PLOT = ""  # --plot without a PNG: PLOT_FILE in the first RUN_DIR


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    status = subparsers.add_parser(
        "status", help="summarise a running or finished search; --plot draws its progress against its cost"
    )
    status.add_argument(
        "run_dir",
        nargs="+",
        metavar="RUN_DIR",
        help="a run directory (a search's output_dir; a progressive job's: its latest started stage); several: "
        "each summarised, and drawn on one axis with --plot",
    )
    status.add_argument(
        "--json",
        action="store_true",
        help="print the summary as one JSON document (for scripts and dashboards; several runs: a list)",
    )
    status.add_argument(
        "--plot",
        nargs="?",
        const=DEFAULT_PLOT,
        metavar="FILE",
        help=f"also draw the best search perplexity so far against window-equivalents (a window's forward: 1, one "
        f"with a backward pass: 1 + c), one line per run, into FILE in the format its extension names (.png, .pdf, "
        f".svg, ...; default: the first RUN_DIR's {PLOT_FILE}); never a run directory's own file; the path written "
        "is printed",
    )
    status.add_argument(
        "--backward-cost",
        metavar="C",
        help="c, what a backward window pass costs in forwards (default: what `longrope estimate` prices it at for "
        "each run's model, a FLOPs ratio; only runs with gradient steps have backward passes)",
    )
    status.set_defaults(handler=run_status_command)


def run_status_command(args: argparse.Namespace) -> int:
    """Every run is read (and drawn) before anything is printed, so bad input is one error line and nothing else;
    the plot's path is checked before any run is read (`output_paths`: never a run's own file)."""
    repeated = repeated_path(args.run_dir)
    if repeated:
        raise JobConfigError(f"status: {repeated}; give each run directory once")
    if args.backward_cost is not None:
        args.backward_cost = _backward_cost_value(args.backward_cost, args.plot is not None)
    for path in args.run_dir:
        RunDir(path).check_directory()  # a mistyped RUN is named as such, not as the folder of its default plot
    if args.plot is not None:
        args.plot = plot_path(args)
    statuses = [run_status(RunDir(path)) for path in args.run_dir]
    written = write_plot(args, statuses) if args.plot is not None else None
    if args.json:
        shown = [status.as_json() for status in statuses]
        print(json.dumps(shown[0] if len(shown) == 1 else shown, indent=2))
    else:
        print("\n\n".join(format_status(status) for status in statuses))
    if written is not None:
        cli_console().print(f"status: wrote {written}", markup=False, highlight=False)
    return 0


def _backward_cost_value(text: str, plotting: bool) -> float:
    if not plotting:
        raise JobConfigError("--backward-cost: it prices the window-equivalents --plot draws; give --plot too")
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 <= value <= MAX_BACKWARD_COST):
        raise JobConfigError(f"--backward-cost: must be a number from 0 to {MAX_BACKWARD_COST:g}, got {text!r}")
    return value


def plot_path(args: argparse.Namespace) -> Path:
    """Where --plot writes, checked before anything is read: by export's rules for an output file
    (`check_output_path`), in a format matplotlib writes that the name's extension says (none: PNG)."""
    from longrope.search.reports.progress_plot import plot_format  # matplotlib: only for --plot

    path = Path(args.plot or Path(args.run_dir[0]) / PLOT_FILE)
    where = f"--plot {shown_path(path)!r}"
    check_output_path(path, where)
    plot_format(path, where)
    return path


def write_plot(args: argparse.Namespace, statuses: list[RunStatus]) -> Path:
    from longrope.search.reports import progress_plot  # matplotlib: only for --plot

    runs = [progress_plot.plotted_run(path) for path in args.run_dir]
    priced = [
        _price(run, status, args.backward_cost) if run.backward_windows else None
        for run, status in zip(runs, statuses, strict=True)
    ]
    prices = [None if price is None else price[0] for price in priced]
    label, per_run = cost_label([price for price in priced if price is not None])
    lines = [progress_plot.progress_line(run, c or 0.0) for run, c in zip(runs, prices, strict=True)]
    if per_run:
        lines = [
            line if c is None else progress_plot.ProgressLine(f"{line.label}, c = {c:.2f}", line.cost, line.perplexity)
            for line, c in zip(lines, prices, strict=True)
        ]
    progress_plot.plot_progress(lines, label, args.plot, title=progress_plot.lengths_title(runs))
    return args.plot


def _price(run, status: RunStatus, given: float | None) -> tuple[float, str]:
    """(c, where it comes from) for a run with backward passes: the one given, else `longrope estimate`'s for
    its model and length."""
    if given is not None:
        return given, "--backward-cost"
    try:
        config = RunDir(status.run_dir).read_config()
        c, model = job_backward_cost(config, status.original_length)
        return c, f"longrope estimate's FLOPs ratio for {model}"
    except (JobConfigError, ModelLoadError) as exc:
        raise JobConfigError(
            f"--plot: {run.given} has {run.backward_windows} backward window passes, and what one costs cannot be "
            f"priced here ({exc}); give --backward-cost C"
        ) from exc


def cost_label(priced: list[tuple[float, str]]) -> tuple[str, bool]:
    """The x axis's label, naming c and where it comes from, for the runs with backward passes' (c, source); and
    whether c differs between them (then each such run's line names its own)."""
    if not priced:
        return "window-equivalents (window forward passes: no backward pass in these runs)", False
    what = "window-equivalents: forward + c × backward window passes"  # two lines: the second names c
    if len({(round(c, 2), source) for c, source in priced}) == 1:
        return f"{what}\nc = {priced[0][0]:.2f} ({priced[0][1]})", False
    sources = ", ".join(dict.fromkeys(source for _, source in priced))
    return f"{what}\nc per run in the legend ({sources})", True
