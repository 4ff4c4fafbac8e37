"""`longrope validate | search | status | export | compare`: the search service from the command line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from longrope.search.export import factors_file_of_run, write_export, write_into_model
from longrope.search.job_config import JobConfig, JobConfigError, load_job_config
from longrope.search.run_store import CONFIG, RunDir
from longrope.search.status import format_status, run_status


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    validate = subparsers.add_parser("validate", help="print the resolved job config, or every error in it")
    _config_arguments(validate)
    validate.set_defaults(handler=run_validate)

    search = subparsers.add_parser("search", help="start a search job, or continue one with --resume RUN_DIR")
    search.add_argument("config", nargs="?", help="job config YAML (optional with --resume)")
    search.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a field")
    search.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR")
    search.add_argument("--no-progress", action="store_true", help="log lines only, no progress bar")
    search.set_defaults(handler=run_search_command)

    status = subparsers.add_parser("status", help="summarise a running or finished search")
    status.add_argument("run_dir")
    status.add_argument("--json", action="store_true")
    status.set_defaults(handler=run_status_command)

    export = subparsers.add_parser("export", help="write a run's best factors (transformers rope_parameters)")
    export.add_argument("run_dir")
    export.add_argument("-o", "--output", type=Path, help="output file (JSON, or CSV with --format csv)")
    export.add_argument("--format", choices=["json", "csv"], default="json")
    export.add_argument("--into", type=Path, metavar="MODEL_DIR", help="write the block into MODEL_DIR/config.json")
    export.add_argument("--allow-n-hat", action="store_true", help="export an n_hat > 0 candidate anyway")
    export.set_defaults(handler=run_export_command)

    verify = subparsers.add_parser(
        "verify", help="check that transformers and vLLM apply a factors file exactly as the scorer did"
    )
    verify.add_argument("factors", help="a factors JSON (longrope export)")
    verify.add_argument("--model", required=True, type=Path, metavar="DIR", help="the model directory")
    verify.add_argument("--no-logits", action="store_true", help="compare cos/sin only (no weights loaded)")
    verify.add_argument("--device", default="cpu", help="where the logits check runs (cpu, cuda, auto); float32")
    verify.add_argument("--json", action="store_true")
    verify.set_defaults(handler=run_verify_command)

    compare = subparsers.add_parser("compare", help="rerun the baselines (and given factors) on the test split")
    _config_arguments(compare)
    compare.add_argument("--factors", action="append", default=[], metavar="FILE", help="a factors JSON (repeat)")
    compare.add_argument("--lengths", help="comma-separated lengths (default: original x 2^k up to the target)")
    compare.add_argument("-o", "--out-dir", type=Path, help="default: OUTPUT_DIR/compare")
    compare.set_defaults(handler=run_compare_command)


def _config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="job config YAML")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a field")


def run_validate(args: argparse.Namespace) -> int:
    from longrope.search.job_context import JobContext  # the model check needs torch (meta device), not Ray

    config = load_job_config(args.config, args.set)
    context = JobContext.resolve(config)
    context.seeds()
    print(
        json.dumps(
            {
                "config_hash": config.hash(),
                "original_length": context.original_length,
                "config": config.model_dump(mode="json"),
            },
            indent=2,
        )
    )
    return 0


def run_search_command(args: argparse.Namespace) -> int:
    from longrope.search.jobs import run_search  # Ray and the scorer: only for the commands that score

    if not args.config and not args.resume:
        raise JobConfigError("search: give a CONFIG, or --resume RUN_DIR")
    config = load_job_config(args.config, args.set) if args.config else _resume_overrides(args.resume, args.set)
    run_dir = RunDir(args.resume or config.output_dir)
    try:
        best = run_search(config, resume_dir=args.resume, show_progress=not args.no_progress)
    except KeyboardInterrupt as exc:
        exc.hint = (
            f"; every scored candidate is on disk, continue with: longrope search --resume {run_dir.path}"
            if run_dir.file(CONFIG).exists()
            else "; no run was started"
        )
        raise
    print(json.dumps({"best_perplexity": best["perplexity"], "key": best["key"]}))
    return 0


def _resume_overrides(run_dir: str, overrides: list[str]) -> JobConfig | None:
    """`--resume DIR --set workers.X=...`: the stored config scored elsewhere; any other field would change the
    run itself, which a resume cannot do."""
    if not overrides:
        return None
    for text in overrides:
        if not text.strip().startswith("workers."):
            raise JobConfigError(
                f"--set {text!r}: a resumed run can change only workers.* (where it is scored), not the search"
            )
    return load_job_config(None, overrides, base=RunDir(run_dir).read_config().model_dump(mode="json"))


def run_status_command(args: argparse.Namespace) -> int:
    status = run_status(RunDir(args.run_dir))
    print(json.dumps(status, indent=2) if args.json else format_status(status))
    return 0


def run_export_command(args: argparse.Namespace) -> int:
    if not args.output and not args.into:
        raise JobConfigError("export: give -o FILE and/or --into MODEL_DIR")
    factors = factors_file_of_run(RunDir(args.run_dir), allow_n_hat=args.allow_n_hat)
    console = Console(stderr=True)
    if factors.provenance.model_extra.get("n_hat"):
        console.print("export: n_hat is not part of transformers' longrope; transformers and vLLM will ignore it")
    if args.output:
        write_export(factors, args.output, args.format)
        console.print(f"export: wrote {args.output}")
    if args.into:
        backup = write_into_model(factors, args.into)
        console.print(f"export: wrote rope_parameters into {args.into / 'config.json'} (backup {backup.name})")
    return 0


def run_verify_command(args: argparse.Namespace) -> int:
    """One line per runtime; exit 1 when either applies the block differently from the scorer."""
    from longrope.search.factors_file import read_factors_file
    from longrope.search.verify import verify

    factors = read_factors_file(args.factors)
    report = verify(factors, args.factors, args.model, logits=not args.no_logits, device=args.device)
    if args.json:
        print(json.dumps({**report.model_dump(mode="json"), "ok": report.ok}, indent=2))
    else:
        for check in report.checks:
            print(check.line())
    return 0 if report.ok else 1


def run_compare_command(args: argparse.Namespace) -> int:
    from longrope.search.compare import default_lengths, markdown_table, run_compare
    from longrope.search.job_context import JobContext
    from longrope.search.needle_report import needle_table

    config = load_job_config(args.config, args.set)
    context = JobContext.resolve(config)
    lengths = _parse_lengths(args.lengths) or default_lengths(context.original_length, context.target_length)
    out_dir = args.out_dir or Path(config.output_dir) / "compare"
    console = Console(stderr=True)
    result = run_compare(
        context, factors_files=args.factors, lengths=lengths, out_dir=out_dir, log=lambda line: console.print(line)
    )
    print(markdown_table(result))
    print()
    print(needle_table(result))
    console.print(
        f"compare: wrote {out_dir}/compare.json, compare.md, perplexity_vs_length.png, factors.png, needle_heatmap.png"
    )
    return 0


def _parse_lengths(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise JobConfigError(f"--lengths: expected comma-separated integers, got {text!r}") from None
