"""The `longrope` console script: one entry point, one subcommand per thing a user does."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings

from longrope.search.cli import (
    downloads_commands,
    encodings_commands,
    estimate_command,
    extrapolation_command,
    search_commands,
    status_command,
    train_reference,
)
from longrope.search.cli.stops import SigtermSeen, Stopped, raise_terminated
from longrope.search.config.factors_file import package_version
from longrope.workers.errors import LongRopeError, Terminated


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="longrope", description="Search per-dimension RoPE rescale factors (LongRoPE) and compare baselines."
    )
    parser.add_argument("--version", action="version", version=f"longrope-search {package_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    encodings_commands.add_parser(subparsers)
    train_reference.add_parser(subparsers)
    search_commands.add_parsers(subparsers)
    status_command.add_parser(subparsers)
    estimate_command.add_parser(subparsers)
    extrapolation_command.add_parser(subparsers)
    downloads_commands.add_parsers(subparsers)
    return parser


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """Warnings meant for the user (fewer workers than asked, GPU workers on CPUs) as one line, not two."""
    return f"longrope: warning: {message}\n"


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand. Bad input: one line, exit 2. Ctrl-C: exit 130; SIGTERM: exit 143 (128 + signal), each
    with one line (a search says how to resume). A reader that closes the pipe (`| head`) ends it quietly."""
    args = build_parser().parse_args(argv)
    warnings.formatwarning = _one_line_warning
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    SigtermSeen.received = False
    try:
        code = args.handler(args)
        sys.stdout.flush()  # inside the try: a closed pipe must end here, not in the flush at exit
        return code
    except LongRopeError as exc:  # the input or the run cannot go on: one line, exit 2
        print(f"longrope: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        stopped = exc if isinstance(exc, Stopped) else Stopped(terminated=isinstance(exc, Terminated), hint="")
        terminated = stopped.terminated or SigtermSeen.received
        cause = "SIGTERM" if terminated else "Ctrl-C"
        interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the line short
        print(f"longrope: stopped by {cause}{stopped.hint}", file=sys.stderr)
        signal.signal(signal.SIGINT, interrupt)
        return 128 + (signal.SIGTERM if terminated else signal.SIGINT)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit-time flush is quiet too
        return 128 + signal.SIGPIPE
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
