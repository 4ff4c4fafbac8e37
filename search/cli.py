"""The `longrope` console script: one entry point, one subcommand per thing a user does."""

from __future__ import annotations

import argparse
import sys

from longrope.encodings.errors import EncodingConfigError
from longrope.search import cli_encodings, cli_search, cli_workers
from longrope.search.export import ExportError
from longrope.search.factors_file import package_version
from longrope.search.job_config import JobConfigError
from longrope.search.run_store import RunStoreError
from longrope.workers.errors import DataError, ModelLoadError, WorkerPoolError

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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except USER_ERRORS as exc:
        print(f"longrope: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
