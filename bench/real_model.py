"""A real model read past its pre-trained length: every baseline, NTK and YaRN tuned, and our searched factors, on
held-out documents at the start length and the target, with paired 95% intervals (SmolLM2-135M at 16k and 32k,
Gemma 3 270M at 64k: the job's config says which); and what a forward and a gradient pass cost at 16k in float32
and bfloat16.

Why a script of its own and not `longrope compare`: on this 2-core CPU every (method, window) at 16k is a 95 s
forward and the table is about 200 of them, more than one sitting. So every score is appended to a log as it lands
(bench/score_log.py: bench/results/smollm2_16k_scores.jsonl, one JSON line per set, length, method and window), a
killed run resumes where it stopped, `table --partial` reads the windows scored so far beside a running table, and
the table is built from the log with compare's own code (`compare.summarize`, `write_outputs`:
the same intervals, the same paired difference to the best baseline, the same plots). The methods are compare's:
the job's nominal baselines, NTK and YaRN tuned on the search split's windows at the target (the `coarse` grid of
search/reports/tuned_baselines.py: 15 settings, each a 16k forward per search window), and the factors files given.

Parts:
- `table`: scores what the log lacks, then writes bench/results/smollm2_16k/ (compare.json, compare.md, plots)
  and smollm2_16k.json (the table with provenance and the search's cost, read from the run directory); `--config`
  another target's config (configs/smollm2-135m-32k-cpu.yaml: 8k, 16k and 32k, its own log smollm2_32k_scores.jsonl
  and table smollm2_32k), `--factors` once per searched row (several arms in one table; none while the search
  still runs: the baselines' and the tuning's scores land in the log, and a later table with the factors reuses
  them);
- `ranking`: does bfloat16 rank the table's methods as float32 does (the search keeps the lowest score, so the
  order is what must hold)? The methods again on the first `--windows` test windows at the target in float32,
  against their bfloat16 scores from the log (`bench/rank_agreement.py`: Kendall's tau, the best the same,
  the largest NLL difference);
- `speed`: tokens per second of a forward and of a gradient pass (Scorer.score_with_gradient: the forward again
  under checkpointing, then the backward) on one 16k window, in float32 and in bfloat16.

Run (after `make real-model` and the search, `longrope search configs/smollm2-135m-16k.yaml`):
  .venv/bin/python bench/real_model.py table --run runs/smollm2-135m-16k \
    --factors bench/results/smollm2_16k_factors.json
  .venv/bin/python bench/real_model.py table --config configs/smollm2-135m-32k-cpu.yaml --windows 6 \
    --short-windows 4 --factors bench/results/smollm2_32k_factors.json --factors bench/results/smollm2_16k_factors.json
  .venv/bin/python bench/real_model.py table --config configs/gemma3-270m-64k-cpu.yaml --windows 4 \
    --short-windows 2 --run runs/gemma3-270m-64k-cpu --factors bench/results/gemma3_64k_factors.json
  .venv/bin/python bench/real_model.py ranking --factors bench/results/smollm2_16k_factors.json
  .venv/bin/python bench/real_model.py speed
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from benchlib import RESULTS, ROOT, provenance, run_status, save_json
from score_log import LogSetup, ScoreLog, fingerprint

from longrope.search.config.tuning_grids import TUNING_GRIDS
from longrope.search.job.job_context import JobContext
from longrope.search.optimizers.factory import load_job_config
from longrope.search.reports.compare import default_lengths, summarize, write_outputs
from longrope.search.reports.compare_rows import factors_rows, given_methods
from longrope.search.reports.compare_tables import markdown_table
from longrope.search.reports.tuned_baselines import pick_tuned, setting_label, tuning_grids
from longrope.workers.models import load_model
from longrope.workers.scorer import Scorer

CONFIG = ROOT / "configs" / "smollm2-135m-16k.yaml"


def stem(config) -> str:
    """The name of a job's results: the first word of its config's name and its target in k tokens, smollm2_16k (its
    score log smollm2_16k_scores.jsonl, its table smollm2_16k/ and smollm2_16k.json) for configs/smollm2-135m-16k.yaml
    and its -ga and -hybrid arms alike (one model, one log), gemma3_64k for configs/gemma3-270m-64k-cpu.yaml."""
    return f"{config.name.split('-')[0]}_{config.target_length // 1024}k"


def score_log(results: str, context: JobContext, read_only: bool = False) -> ScoreLog:
    """The target's score log (`read_only`: as it stands, beside a run that may be adding to it), in `results`,
    made if it is not there yet."""
    if not read_only:
        Path(results).mkdir(parents=True, exist_ok=True)
    return ScoreLog(Path(results) / f"{stem(context.config)}_scores.jsonl", LogSetup.of(context), read_only)


def window_ids(windows) -> list[str]:
    """A window's identity in the log: its document and first token (an index would change with the count)."""
    return [f"{name}@{offset}" for name, offset in zip(windows.names, windows.offsets, strict=True)]


class WindowScorer:
    """One loaded model; a Scorer per window set; each (method, window) scored once and logged."""

    def __init__(self, context: JobContext, log: ScoreLog, dtype: str | None = None):
        self.model, self.rope = load_model(
            context.model_dir,
            device="cpu",
            dtype=dtype or context.config.model.dtype,
            config_overrides=dict(context.model_overrides),  # as the workers load it (a sliding window kept or not)
        )
        self.log, self.scorers = log, {}

    def scorer(self, kind: str, length: int, windows) -> Scorer:
        if (kind, length) not in self.scorers:
            tokens = torch.from_numpy(np.asarray(windows.tokens))
            self.scorers[(kind, length)] = Scorer(
                self.model, tokens, self.rope.method.original_inv_freq(), candidates_per_forward=1
            )
        return self.scorers[(kind, length)]

    def score(self, kind: str, length: int, windows, methods: dict, first: int | None = None) -> None:
        """Every method on each window (the first `first` only, when given) that the log lacks."""
        scorer = self.scorer(kind, length, windows)
        ids = window_ids(windows)[:first]
        todo = [
            (w, n)
            for w, window_id in enumerate(ids)
            for n in methods
            if (kind, length, n, window_id) not in self.log.scores
        ]
        countdown = Countdown(len(todo))
        for window, name in todo:
            key = (kind, length, name, ids[window])
            twin = self.log.copied_twin(key, methods)
            if twin is not None:
                countdown.skip()
                print(f"{kind} {length} window {window} {name}: the same numbers as {twin}, its score", flush=True)
                continue
            start = time.perf_counter()
            (score,) = scorer.score([methods[name]], (window, window + 1))
            seconds = time.perf_counter() - start
            self.log.add(key, float(score.nll[0]), int(score.tokens[0]), seconds)
            ppl = np.exp(score.nll[0] / score.tokens[0])
            print(f"{kind} {length} window {window} {name}: ppl {ppl:.3f} {countdown.scored(seconds)}", flush=True)


class Countdown:
    """Where one (set, length)'s scoring stands, for its lines: forwards done of those the log lacked, and the rest
    at the mean time so far (a window's twin, copied from the log, costs nothing and leaves the count)."""

    def __init__(self, total: int):
        self.total, self.done, self.seconds = total, 0, 0.0

    def skip(self) -> None:
        self.total -= 1

    def scored(self, seconds: float) -> str:
        self.done, self.seconds = self.done + 1, self.seconds + seconds
        left = (self.total - self.done) * self.seconds / self.done
        return f"[{self.done}/{self.total}, {left / 3600:.1f} h left]"


def tuned(context: JobContext, scorer: WindowScorer, grid: str, partial: bool = False) -> tuple[dict, dict]:
    """NTK and YaRN tuned on the search windows at the target, picked by compare's own rule (`pick_tuned`);
    `partial`: from the log alone (nothing scored), refused while a setting is missing."""
    data = context.config.data
    windows = context.windows(data.search_source, context.target_length, data.search_windows)
    grids, ids = tuning_grids(context, grid), window_ids(windows)
    labelled = {setting_label(name, key): method for name, found in grids.items() for key, method in found.items()}
    scorer.log.check_methods(labelled)
    if not partial:
        scorer.score("tuning", context.target_length, windows, labelled)
    nll = {label: scorer.log.means("tuning", context.target_length, label, ids) for label in labelled}
    missing = [label for label, value in nll.items() if value is None]
    if missing:
        raise SystemExit(f"--partial: the log has no tuning score of {missing[0]!r} yet: run the table without it")
    methods, settings = pick_tuned(context, grids, {label: float(np.mean(value)) for label, value in nll.items()})
    settings["tuning_grid"] = {"name": grid, "settings": len(labelled)}
    return methods, settings


def table_methods(context: JobContext, scorer: WindowScorer, args: argparse.Namespace) -> tuple[dict, dict, dict]:
    """(methods by their label in the log, the tuned ones' settings, the factors file's searched length): the table's
    rows. A tuned row's log label carries its method's fingerprint (`tuned_label`): which setting wins can change
    with the grid, and a new pick must not read the old one's scores (a pick scored before under the bare name is
    found by its recorded fingerprint and copied, `ScoreLog.copied_twin`)."""
    files, searched_lengths = given_methods(context, factors_rows(args.factors), print)
    scorer.log.check_methods({**context.baselines(), **files})  # before any forward: a stale log stops here
    tuned_methods, settings = tuned(context, scorer, args.grid, partial=getattr(args, "partial", False))
    methods = {**context.baselines(), **{tuned_label(n, m): m for n, m in tuned_methods.items()}, **files}
    scorer.log.check_methods(methods)
    return methods, settings, searched_lengths


def tuned_label(name: str, method) -> str:
    return f"{name} {fingerprint(method)}"


def table_name(label: str) -> str:
    """A log label's row in the table: a tuned row's without its fingerprint."""
    name, _, rest = label.partition(" ")
    return name if name in ("ntk_tuned", "yarn_tuned") and rest else label


def run_table(args: argparse.Namespace) -> None:
    config = load_job_config(Path(args.config), [f"data.test_windows={args.windows}", *args.set])
    context = JobContext.resolve(config)
    log = score_log(args.results, context, read_only=args.partial)
    scorer = WindowScorer(context, log)
    methods, settings, searched_lengths = table_methods(context, scorer, args)
    lengths = (
        [int(n) for n in args.lengths.split(",")]
        if args.lengths
        else default_lengths(context.original_length, context.target_length, context.start_length)
    )
    ids = {}
    for length in sorted(lengths, reverse=True):  # the target first: the headline figure
        count = args.windows if length == context.target_length else args.short_windows or args.windows
        windows = context.windows(config.data.test_source, length, count)
        ids[length] = window_ids(windows)
        if args.partial:  # only the windows every method has a score on, from the log; nothing scored
            done = [w for w in ids[length] if all(("perplexity", length, m, w) in log.scores for m in methods)]
            ids[length] = done
        else:
            scorer.score("perplexity", length, windows, methods)
    lengths = [n for n in lengths if ids[n]]
    if not lengths:
        raise SystemExit("--partial: no test window has a score of every method yet; run the table without it")
    per_window = {
        table_name(label): {str(n): log.means("perplexity", n, label, ids[n]) for n in lengths} for label in methods
    }
    methods = {table_name(label): method for label, method in methods.items()}
    result = summarize(context, methods, per_window, lengths, settings, searched_lengths)
    name = args.name or stem(config)
    out = Path(args.results) / name
    out.mkdir(parents=True, exist_ok=True)
    write_outputs(result, out)
    saved = {
        **provenance(),
        "windows": {str(n): len(ids[n]) for n in lengths},
        "lengths": lengths,
        "table": markdown_table(result),
    }
    saved |= {"tuned": settings, "search": run_status(Path(args.run)) if args.run else None, "result": result}
    save_json(Path(args.results) / f"{name}.json", saved)
    print(markdown_table(result))


def run_ranking(args: argparse.Namespace) -> None:
    """The table's methods at the target on its first test windows, float32 against the log's bfloat16."""
    from rank_agreement import rank_agreement

    config = load_job_config(CONFIG, [f"data.test_windows={args.table_windows}", *args.set])
    context = JobContext.resolve(config)
    log = score_log(args.results, context)
    table_scorer = WindowScorer(context, log)  # bfloat16: the table's own scores, logged once
    methods, _, _ = table_methods(context, table_scorer, args)
    windows = context.windows(config.data.test_source, context.target_length, args.table_windows)
    table_scorer.score("perplexity", context.target_length, windows, methods, first=args.windows)
    del table_scorer
    WindowScorer(context, log, dtype="float32").score("float32", context.target_length, windows, methods, args.windows)
    ids, n = window_ids(windows)[: args.windows], context.target_length
    bf16 = [float(np.mean(log.means("perplexity", n, name, ids))) for name in methods]
    fp32 = [float(np.mean(log.means("float32", n, name, ids))) for name in methods]
    agreement = rank_agreement(fp32, bf16, best_k=3).as_dict()
    rows = {table_name(name): {"float32": a, "bfloat16": b} for name, a, b in zip(methods, fp32, bf16, strict=True)}
    save_json(
        Path(args.results) / "smollm2_bf16_ranking.json",
        {**provenance(), "windows": ids, "mean_nll": rows, **agreement},
    )
    print(json.dumps(agreement, indent=1))


def run_speed(args: argparse.Namespace) -> None:
    """Tokens per second of a forward and a gradient pass on one window at the target, in both dtypes."""
    config = load_job_config(CONFIG, args.set)
    context = JobContext.resolve(config)
    windows = context.windows(config.data.test_source, context.target_length, 1)
    tokens = torch.from_numpy(np.asarray(windows.tokens))
    candidate = context.baselines()["yarn"]
    rates = {}
    for dtype in ("bfloat16", "float32"):
        model, rope = load_model(context.model_dir, device="cpu", dtype=dtype)
        scorer = Scorer(model, tokens, rope.method.original_inv_freq(), candidates_per_forward=1)
        start = time.perf_counter()
        scorer.score([candidate])
        forward = time.perf_counter() - start
        start = time.perf_counter()
        scorer.score_with_gradient(
            context.longrope(
                candidate.factors(context.target_length).double(), attention_factor=candidate.attention_factor
            )
        )
        gradient = time.perf_counter() - start
        n = context.target_length
        rates[dtype] = {
            "forward_seconds": forward,
            "forward_tokens_per_second": n / forward,
            "gradient_seconds": gradient,
            "gradient_tokens_per_second": n / gradient,
        }
        print(dtype, rates[dtype], flush=True)
        del model, scorer
    save_json(
        Path(args.results) / "smollm2_speed.json",
        {
            **provenance(),
            "length": context.target_length,
            "rates": rates,
            "bf16_speedup_forward": rates["float32"]["forward_seconds"] / rates["bfloat16"]["forward_seconds"],
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parts = parser.add_subparsers(dest="part", required=True)
    table = parts.add_parser("table")
    table.add_argument("--config", default=str(CONFIG), help="the search's config: its model, data and lengths")
    table.add_argument(
        "--factors",
        action="append",
        default=[],
        help="a search's export (longrope export RUN -o FILE); repeatable; none: the baselines alone",
    )
    table.add_argument("--run", help="the search's run directory, for its cost")
    table.add_argument("--windows", type=int, default=8, help="test windows at the target length")
    table.add_argument("--short-windows", type=int, help="test windows at the shorter lengths (default: --windows)")
    table.add_argument("--name", help="the table's name in --results (default: the log's stem, e.g. smollm2_16k)")
    table.add_argument("--lengths", help="default: the original length, doubled up to the target (compare's)")
    table.add_argument("--grid", choices=sorted(TUNING_GRIDS), default="coarse")
    table.add_argument("--partial", action="store_true", help="the table of the windows scored so far; score none")
    table.add_argument("--set", action="append", default=[])
    table.set_defaults(run_part=run_table)
    ranking = parts.add_parser("ranking")
    ranking.add_argument("--factors", action="append", required=True)
    ranking.add_argument("--windows", type=int, default=2, help="the table's first test windows, also in float32")
    ranking.add_argument("--table-windows", type=int, default=8, help="the table's test windows per length")
    ranking.add_argument("--grid", choices=sorted(TUNING_GRIDS), default="coarse")
    ranking.add_argument("--set", action="append", default=[])
    ranking.set_defaults(run_part=run_ranking)
    speed = parts.add_parser("speed")
    speed.add_argument("--set", action="append", default=[])
    speed.set_defaults(run_part=run_speed)
    for part in (table, ranking, speed):
        part.add_argument("--results", default=str(RESULTS), help="where the log and the results go")
    args = parser.parse_args()
    args.run_part(args)


if __name__ == "__main__":
    main()
