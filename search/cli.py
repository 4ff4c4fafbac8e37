"""The `longrope` console script: one entry point, one subcommand per thing a user does."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings

from longrope.encodings.errors import EncodingConfigError
from longrope.search import cli_encodings, cli_estimate, cli_extrapolation, cli_search, cli_workers
from longrope.search.export import ExportError
from longrope.search.factors_file import package_version
from longrope.search.job_config import JobConfigError
from longrope.search.run_store import RunStoreError
from longrope.workers.errors import DataError, ModelLoadError, Terminated, WorkerPoolError

# Errors that mean "the user's input is wrong": one line on stderr and exit 2, no traceback.
USER_ERRORS = (
    EncodingConfigError,
    JobConfigError,
    RunStoreError,
    ExportError,
    DataError,
    ModelLoadError,
    WorkerPoolError,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="longrope", description="Search per-dimension RoPE rescale factors (LongRoPE) and compare baselines."
    )
    parser.add_argument("--version", action="version", version=f"longrope-search {package_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    cli_encodings.add_parser(subparsers)
    cli_workers.add_parser(subparsers)
    cli_search.add_parsers(subparsers)
    cli_estimate.add_parser(subparsers)
    cli_extrapolation.add_parser(subparsers)
    return parser


class _SigtermSeen:
    """Whether this process received SIGTERM. Ray's core worker runs Python signal handlers inside its own wait
    loops and turns whatever they raise into a plain KeyboardInterrupt (`ray._raylet.check_signals`), so a
    `Terminated` raised during `ray.get`/`ray.wait` arrives as Ctrl-C; the flag keeps the stop's true cause."""

    received = False


def _raise_terminated(signum, frame) -> None:
    _SigtermSeen.received = True
    raise Terminated()


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """Warnings meant for the user (fewer workers than asked, GPU workers on CPUs) as one line, not two."""
    return f"longrope: warning: {message}\n"


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand. Bad input: one line, exit 2. Ctrl-C: exit 130; SIGTERM: exit 143 (128 + signal), each
    with one line (a search says how to resume). A reader that closes the pipe (`| head`) ends it quietly."""
    args = build_parser().parse_args(argv)
    warnings.formatwarning = _one_line_warning
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    _SigtermSeen.received = False
    try:
        code = args.handler(args)
        sys.stdout.flush()  # inside the try: a closed pipe must end here, not in the flush at exit
        return code
    except USER_ERRORS as exc:
        print(f"longrope: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated) or _SigtermSeen.received
        cause = "SIGTERM" if terminated else "Ctrl-C"
        interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the line short
        print(f"longrope: stopped by {cause}{getattr(exc, 'hint', '')}", file=sys.stderr)
        signal.signal(signal.SIGINT, interrupt)
        return 128 + (signal.SIGTERM if terminated else signal.SIGINT)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit-time flush is quiet too
        return 128 + signal.SIGPIPE
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
