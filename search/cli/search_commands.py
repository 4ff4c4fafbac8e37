"""`longrope validate | search | export | verify | compare`: the search service from the command line (`status`:
status_command.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from longrope.search.cli.console import cli_console
from longrope.search.cli.estimate_command import job_backward_cost
from longrope.search.cli.progress import CountProgress
from longrope.search.cli.reporter import ConsoleReporter
from longrope.search.cli.stops import ResumableWorkerError, SigtermSeen, Stopped
from longrope.search.config.job_config import JobConfig
from longrope.search.config.strict import JobConfigError
from longrope.search.export.factors_export import (
    FORMATS,
    STDOUT,
    export_format,
    factors_file_of_run,
    factors_of_path,
    stdout_export,
    unfinished_warning,
    write_export,
    write_into_model,
)
from longrope.search.export.gguf_export import ROPE_FREQS, write_gguf_export
from longrope.search.export.verify import verify
from longrope.search.job.job_context import JobContext
from longrope.search.job.validation_checks import (
    compare_window_tokens,
    data_source_checks,
    file_checks_of,
    offline_checks,
)
from longrope.search.optimizers.factory import load_job_config, search_plan
from longrope.search.reports.compare_out import CompareOut
from longrope.search.reports.compare_tables import markdown_table
from longrope.search.reports.needle_report import needle_table
from longrope.search.run.run_store import CONFIG, RunDir, RunStoreError
from longrope.workers.devices import device_problem
from longrope.workers.errors import ModelLoadError, Terminated, WorkerPoolError


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    validate = subparsers.add_parser(
        "validate", help="check a job config as `search` would, and say ok with a short summary, or what is wrong"
    )
    _config_arguments(validate)
    validate.add_argument(
        "--offline", action="store_true", help="check the config only: the model and data may be on the cluster"
    )
    validate.add_argument(
        "--json", action="store_true", help="print the resolved config and every check as one JSON document"
    )
    validate.set_defaults(handler=run_validate)

    search = subparsers.add_parser("search", help="start a search job, or continue one with --resume RUN_DIR")
    search.add_argument("config", nargs="?", help="job config YAML (optional with --resume)")
    search.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help=SET_HELP)
    search.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR")
    search.add_argument("--no-progress", action="store_true", help="log lines only, no progress bar")
    search.set_defaults(handler=run_search_command)

    export = subparsers.add_parser("export", help="write a run's best factors (transformers rope_parameters)")
    export.add_argument("run_dir", help="a run directory (a search's output_dir), finished or not: its best so far")
    export.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="output file, in the format its extension names (.csv: CSV, anything else: JSON); - prints the JSON on "
        "stdout; a symlink is written through to its target",
    )
    export.add_argument(
        "--format",
        choices=FORMATS,
        help="json: the factors file (the transformers/vLLM rope_parameters block and its provenance); csv: the "
        "LongRoPE release's file, one long factor per line, with the factors file beside it as FILE.json "
        "(default: from -o's extension, else json; one the extension contradicts is refused)",
    )
    export.add_argument("--into", type=Path, metavar="MODEL_DIR", help="write the block into MODEL_DIR/config.json")
    export.add_argument(
        "--gguf",
        type=Path,
        metavar="IN.gguf",
        help="write -o OUT.gguf: a copy of this llama GGUF (never modified) whose rope_freqs.weight, "
        "rope.scaling.attn_factor and context_length make llama.cpp apply the factors",
    )
    export.add_argument("--allow-n-hat", action="store_true", help="export an n_hat > 0 candidate anyway")
    export.set_defaults(handler=run_export_command)

    verify = subparsers.add_parser(
        "verify", help="check that transformers, vLLM and llama.cpp apply a factors file exactly as the scorer did"
    )
    verify.add_argument(
        "factors", help="a factors JSON (longrope export) or a run directory (its best factors, as export writes them)"
    )
    verify.add_argument("--model", required=True, type=Path, metavar="DIR", help="the model directory")
    verify.add_argument("--no-logits", action="store_true", help="compare cos/sin only (no weights loaded)")
    verify.add_argument("--device", default="cpu", help="where the logits check runs (cpu, cuda, auto); float32")
    verify.add_argument("--json", action="store_true")
    verify.set_defaults(handler=run_verify_command)

    compare = subparsers.add_parser("compare", help="rerun the baselines (and given factors) on the test split")
    compare.add_argument(
        "config",
        nargs="?",
        help="job config YAML (optional when a --factors is a run directory: the first one's config.json is the job)",
    )
    compare.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a field")
    compare.add_argument(
        "--factors",
        action="append",
        default=[],
        metavar="PATH",
        help="a factors JSON or a run directory (repeat); its row is file:NAME or run:NAME, with as many parent "
        "folders as tell it apart from the other paths given (file:a/factors.json, file:b/factors.json)",
    )
    compare.add_argument(
        "--label",
        action="append",
        dest="factors",
        type=lambda text: tuple(text.split("=", 1)),  # checked with the other rows: one line, exit 2
        metavar="NAME=PATH",
        help="a factors JSON or a run directory whose row is labelled NAME (repeat)",
    )
    compare.add_argument("--lengths", help="comma-separated lengths (default: original x 2^k up to the target)")
    compare.add_argument(
        "-o",
        "--out-dir",
        type=Path,
        help="where the results go; refused when it holds files, unless --overwrite (default: a new directory "
        "per run, OUTPUT_DIR/compare-YYYYmmdd-HHMMSS of its start, with -2, -3... when that name is taken; when "
        "OUTPUT_DIR is a run directory, RUN-compare-YYYYmmdd-HHMMSS beside it, never inside it)",
    )
    compare.add_argument("--overwrite", action="store_true", help="write into a non-empty --out-dir")
    compare.add_argument(
        "--tuning-grid",
        choices=("full", "coarse"),
        default="full",
        help="the settings NTK and YaRN are tuned over on the search split: full (96) or coarse (15, for a model "
        "where every setting is a long forward); both try LongRoPE's attention factor",
    )
    compare.add_argument("--no-needles", action="store_true", help="perplexity only: no needle retrieval windows")
    compare.set_defaults(handler=run_compare_command)


SET_HELP = (
    "override a field, the value read as YAML (repeat; later wins): search.generations=10; a mapping given for a "
    "section merges into it (search={population: 8, parents: 4} keeps the section's other fields); "
    "every field: configs/README.md"
)


def _config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="job config YAML")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help=SET_HELP)


def run_validate(args: argparse.Namespace) -> int:
    """One verdict line and a short summary of what was checked; `--json`: the resolved config with a "checks"
    list of what was checked and what was skipped. `--offline` (no torch, no Ray) skips what needs the model or
    the cluster's files and says which."""
    config = load_job_config(args.config, args.set)
    if args.offline:
        lengths, checks = {"original_length": config.original_length}, offline_checks(config)
    else:
        files = file_checks_of(config)  # cheap checks first: nothing converted or tokenized for a config they refuse
        context = JobContext.resolve(config)
        lengths, checks = context.lengths(), context.validation_checks(files)
    skipped = [check["what"] for check in checks if check["result"] == "skipped"]
    if args.json:
        if skipped:
            print(f"validate: --offline: not checked: {', '.join(skipped)}", file=sys.stderr)
        document = {"config_hash": config.hash(), **lengths, "checks": checks}
        print(json.dumps({**document, "config": config.model_dump(mode="json")}, indent=2))
    else:
        print("\n".join(validation_summary(config, lengths, checks)))
    return 0


def _plan_text(plan) -> str:
    return f"{plan.candidates} candidates at most ({plan.text})"


def validation_summary(config: JobConfig, lengths: dict[str, int | None], checks: list[dict]) -> list[str]:
    """`validate`'s verdict and the few facts a user checks by eye: the model and lengths (from the length the model
    serves, for one that ships scaling), the search's size and seeds, the data and its windows (a short-factor
    search reads windows of the pre-trained length), and what --offline left unchecked."""
    by_what = {check["what"]: check for check in checks}
    search, data = config.search, config.data
    start = lengths.get("serving_length") or lengths["original_length"]
    span = f"{start} -> {config.target_length} tokens" if start else f"-> {config.target_length} tokens"
    scale = f" (scale {config.target_length / start:g})" if start else " (original_length: from the model)"
    window_length = lengths["original_length"] if search.factor == "short" else config.target_length
    seeds = by_what["search.seeds"]["value"]  # resolved: seed files and other runs included
    count = len(seeds)
    if by_what["search.seeds"]["result"] != "ok":  # --offline: the config's names, and at most as many seeds
        seeds, count = [*search.seeds, *(f"file:{Path(path).name}" for path in search.seed_files)], search.most_seeds()
    lines = [
        f"validate: ok — {config.name}: model {config.model.path}, {span}{scale}",
        f"  search: {search.optimizer}, {_plan_text(search_plan(search, count))}, "
        f"{search.factor} factors, seeds {', '.join(seeds)}",
        f"  search data: {_source_line(by_what['data.search_source'])}; {data.search_windows} search windows of "
        f"{window_length or '(from the model)'} tokens per objective ({', '.join(data.objective_weights())})",
        f"  test data: {_source_line(by_what['data.test_source'])}; {data.test_windows} test windows per length",
        f"  output_dir: {config.output_dir}; config hash {config.hash()}; every field and check: --json",
    ]
    skipped = [check["what"] for check in checks if check["result"] == "skipped"]
    if skipped:
        lines.append(f"  not checked (--offline): {', '.join(dict.fromkeys(skipped))}")
    return lines


def _source_line(check: dict) -> str:
    return f"{check['value']} ({check['detail'].removesuffix(' (not tokenized)')})"


def run_search_command(args: argparse.Namespace) -> int:
    """A worker's error (CUDA OOM, a crash) ends as one `longrope: error:` line with the resume command, and as
    the stop reason in heartbeat.json; Ctrl-C and SIGTERM likewise (the entry point's flag tells them apart)."""
    from longrope.search.job.jobs import run_search  # torch (the scorer), cma: only for `search`; Ray once it scores

    if not args.config and not args.resume:
        raise JobConfigError("search: give a CONFIG, or --resume RUN_DIR")
    config = load_job_config(args.config, args.set) if args.config else _resume_overrides(args.resume, args.set)
    run_dir = RunDir(args.resume or config.output_dir)
    resume = f"longrope search --resume {run_dir.path}"
    try:
        best = run_search(
            config,
            resume_dir=args.resume,
            reporter=ConsoleReporter(cli_console(), show_progress=not args.no_progress),
            sigterm_seen=lambda: SigtermSeen.received,
            # priced once every check has passed: it reads the model's config.json (a .gguf's, converted)
            backward_cost=lambda: _tensorboard_backward_cost(config or _stored_config(run_dir)),
        )
    except KeyboardInterrupt as exc:
        started = run_dir.file(CONFIG).exists()
        hint = f"; every scored candidate is on disk, continue with: {resume}" if started else "; no run was started"
        raise Stopped(terminated=isinstance(exc, Terminated), hint=hint) from exc
    except WorkerPoolError as exc:
        if run_dir.file(CONFIG).exists():
            hint = f"every scored candidate is on disk: fix the cause, then continue with: {resume}"
            raise ResumableWorkerError(str(exc), hint) from exc
        raise
    print(json.dumps({"best_perplexity": best.perplexity, "key": best.key}))
    return 0


def _stored_config(run_dir: RunDir) -> JobConfig | None:
    """A run's stored config, for pricing its backward passes (run_search reads and checks the whole directory)."""
    try:
        return run_dir.read_config() if run_dir.file(CONFIG).is_file() else None
    except (RunStoreError, OSError):
        return None  # run_search says what is wrong with the directory, in one line


def _tensorboard_backward_cost(config: JobConfig | None) -> float | None:
    """c, the price of a backward window pass that `search.tensorboard`'s window-equivalents count (estimate's, for
    the job's model), when the job asks for the scalars and scores backward passes; None otherwise, or when the
    model cannot be priced (the search then says it writes no window-equivalents)."""
    if config is None or not config.search.tensorboard or not search_plan(config.search, 0).backward_steps:
        return None
    try:
        return job_backward_cost(config)[0]
    except (JobConfigError, ModelLoadError):
        return None


def _resume_overrides(run_dir: str, overrides: list[str]) -> JobConfig | None:
    """`--resume DIR --set workers.X=...`: the stored config scored elsewhere (or `search.tensorboard=true`:
    watched from now on); any other field would change the run itself, which a resume cannot do."""
    if not overrides:
        return None
    for text in overrides:
        if not text.strip().startswith(("workers.", "search.tensorboard=")):
            raise JobConfigError(
                f"--set {text!r}: a resumed run can change only workers.* (where it is scored) and "
                "search.tensorboard (whether TensorBoard watches it), not the search"
            )
    return load_job_config(None, overrides, base=RunDir(run_dir).read_config().model_dump(mode="json"))


def run_export_command(args: argparse.Namespace) -> int:
    """`-o -` prints the JSON on stdout (and nothing else there); the format is settled before the run is read."""
    if not args.output and not args.into:
        raise JobConfigError("export: give -o FILE and/or --into MODEL_DIR")
    if args.gguf is not None and args.output in (None, STDOUT):
        raise JobConfigError("--gguf: give -o OUT.gguf, the copy to write (IN.gguf is never modified)")
    if args.gguf is not None and args.format:
        raise JobConfigError(f"--format {args.format}: not with --gguf, whose output is a GGUF file")
    fmt = export_format(args.output, args.format) if args.gguf is None else None
    factors = factors_file_of_run(RunDir(args.run_dir), allow_n_hat=args.allow_n_hat)
    console = cli_console()
    if warning := unfinished_warning(factors, RunDir(args.run_dir)):
        console.print(warning, markup=False, highlight=False)
    if factors.provenance.model_extra.get("n_hat"):
        console.print("export: n_hat is not part of transformers' longrope; transformers and vLLM will ignore it")
    if args.output == STDOUT:
        print(stdout_export(factors, fmt))
    elif args.gguf is not None:
        rope = write_gguf_export(factors, args.gguf, args.output)
        console.print(
            f"export: wrote {args.output}: {args.gguf} with {ROPE_FREQS} (the long factors, applied by llama.cpp at "
            f"every length), attn_factor {rope.attn_factor:g}, context_length {rope.context_length}",
            markup=False,
            highlight=False,
        )
    elif args.output:
        written = write_export(factors, Path(args.output), fmt)
        console.print(f"export: wrote {args.output}")
        for sidecar in written[1:]:
            console.print(f"export: wrote {sidecar} (the full factors file: attention factor, mscales, provenance)")
    if args.into:
        backup = write_into_model(factors, args.into)
        console.print(f"export: wrote rope_parameters into {args.into / 'config.json'} (backup {backup.name})")
    return 0


def run_verify_command(args: argparse.Namespace) -> int:
    """One line per runtime; exit 1 when either applies the block differently from the scorer. FACTORS is a file
    or a run directory, as for `compare --factors`."""
    problem = device_problem(args.device)
    if problem:
        raise JobConfigError(f"--device {args.device!r}: {problem}")
    factors = factors_of_path(args.factors)
    report = verify(factors, args.factors, args.model, logits=not args.no_logits, device=args.device)
    if args.json:
        print(json.dumps({**report.model_dump(mode="json"), "ok": report.ok}, indent=2))
    else:
        for check in report.checks:
            print(check.line())
    return 0 if report.ok else 1


def run_compare_command(args: argparse.Namespace) -> int:
    """The data sources are read and their documents measured against the windows compare cuts before the model is
    resolved (`compare_window_tokens`), as `validate` and `search` check theirs: data too short for a window is one
    line before a `.gguf` model is dequantized into the conversion cache."""
    from longrope.search.reports.compare import OUTPUT_FILES, default_lengths, run_compare  # Ray and torch: only here

    console = cli_console()
    config, notes = _compare_job(args)
    given_lengths = _parse_lengths(args.lengths)
    data_source_checks(config, tokens=compare_window_tokens(config, given_lengths))
    context = JobContext.resolve(config)
    lengths = given_lengths or default_lengths(context.original_length, context.target_length, context.start_length)
    out = (
        CompareOut(args.out_dir, overwrite=args.overwrite)
        if args.out_dir
        else CompareOut.default_out(Path(config.output_dir))
    )
    with CountProgress(console, "compare") as progress:
        result = run_compare(
            context,
            factors_files=args.factors,
            lengths=lengths,
            out_dir=out,
            log=lambda line: console.print(line, markup=False),  # a path may hold [brackets]
            notes=notes,
            progress=progress,
            tuning_grid=args.tuning_grid,
            needles=not args.no_needles,
        )
    print(markdown_table(result))
    print()
    print(needle_table(result))
    console.print(f"compare: wrote {out.path}/ ({', '.join(OUTPUT_FILES)})", markup=False)
    return 0


def _compare_job(args: argparse.Namespace) -> tuple[JobConfig, list[str]]:
    """The job compare reruns: CONFIG with --set, or else the config.json of the first --factors that is a run
    directory, with --set on top and output_dir pointed at that directory (so the windows cache is the search's
    own, and the results go beside it, see `CompareOut.default_out`), whatever folder the search ran from. The
    lines to log once every input has passed its check come with it."""
    if args.config:
        return load_job_config(args.config, args.set), []
    paths = [source[-1] if isinstance(source, tuple) else source for source in args.factors]  # --label NAME=PATH
    run = next((path for path in paths if os.path.isdir(path)), None)
    if run is None:
        raise JobConfigError("compare: give a CONFIG, or a run directory as --factors (its config.json is the job)")
    stored = RunDir(run).read_config().model_dump(mode="json")
    config = load_job_config(None, args.set, base={**stored, "output_dir": str(run)})
    return config, [f"compare: the job is {run}'s (its config.json)"]


def _parse_lengths(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise JobConfigError(f"--lengths: expected comma-separated integers, got {text!r}") from exc
