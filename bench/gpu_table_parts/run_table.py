"""`gpu_table.py run`, on the GPU machine: the joined GGUF checked and dequantized, the model loaded, the forward and
gradient timed at each target, the plan made (plan.py), then the table at every target (tuning, every baseline),
then per target the searches bundle.json names (SmolLM2's: the GA with the surrogate and its polish, the hybrid, and
descent; Gemma 3's: descent), their bests on the test windows, and compare's table.

Every input is checked before anything is written (one line, exit 2): bundle.json, the GGUF's sha256, the weights'
digest against the reference directory's, the windows' hashes. The result file is rewritten after each part, so a
run stopped at its limit keeps what it measured; the search parts stop at their share of the deadline.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from gpu_table_parts.bundle import BUNDLE, TableBundle, read_windows
from gpu_table_parts.gguf_weights import gguf_state_dict, weights_digest, write_model_dir
from gpu_table_parts.plan import Plan, Timing, make_plan, search_seconds
from gpu_table_parts.table import TargetResult

MARGIN_S = 10.0  # kept back from the deadline: writing the result, the last candidate's overrun


class Refused(Exception):
    """Bad input: one line, exit 2, nothing written."""


class TableResult(BaseModel):
    """gpu_table.json: provenance, each phase's seconds, the timings, the plan and each target's result."""

    model_config = ConfigDict(extra="forbid")

    provenance: dict[str, Any]
    device: str
    gpu: str | None
    dry_run: bool
    package: str  # where `longrope` was imported from (the checkout's shim where nothing is installed)
    gguf_sha256: str
    weights_digest: str
    gguf: str | None = None  # the GGUF's name: which model's table
    seconds: dict[str, float] = {}
    timings: list[Timing] = []
    plan: Plan | None = None
    targets: dict[str, TargetResult] = {}
    finished: bool = False

    def markdown(self) -> str:
        """gpu_table.md: one section per target that has its table, headed by its lengths."""
        sections = [
            f"## {entry.compare['original_length']} -> {entry.target_length}\n\n{entry.table}\n"
            for entry in self.targets.values()
            if entry.compare is not None and entry.table is not None
        ]
        return "\n".join(sections)


def read_bundle(folder: Path) -> TableBundle:
    path = folder / BUNDLE
    if not path.is_file():
        raise Refused(f"--bundle: {str(path)!r} does not exist (carry the bundle folder in the last run)")
    try:
        return TableBundle.model_validate_json(path.read_text())
    except ValueError as exc:
        raise Refused(f"--bundle: {str(path)!r} is not a table bundle ({str(exc).splitlines()[0]})") from exc


def checked_inputs(gguf: Path, folder: Path):
    """(bundle, windows, dequantized weights), every one checked; nothing written."""
    from longrope.workers.gguf_model import sha256_file

    bundle = read_bundle(folder)
    if not gguf.is_file():
        raise Refused(f"--gguf: {str(gguf)!r} does not exist (were all its parts joined? bench/gpu_parts.py join)")
    found = sha256_file(gguf)
    if found != bundle.gguf.sha256:
        raise Refused(f"--gguf: {str(gguf)!r} has sha256 {found}, the bundle's GGUF {bundle.gguf.sha256}")
    try:
        windows = read_windows(folder, bundle)
    except (OSError, ValueError) as exc:
        raise Refused(f"--bundle: {str(exc).splitlines()[0]}") from exc
    state = gguf_state_dict(gguf, json.loads(bundle.config_json))
    digest = weights_digest(state)
    if digest != bundle.weights_digest:
        raise Refused(f"--gguf: its weights hash to {digest}, the reference directory's to {bundle.weights_digest}")
    return bundle, windows, state


class TableRun:
    """The run's model, scorers and result file; each method writes the result when its part is done."""

    def __init__(self, args, bundle: TableBundle, windows: dict, model_dir: Path, started: float):
        import torch
        from benchlib import provenance

        import longrope.workers
        from longrope.workers.models import load_model

        self.args, self.bundle, self.started = args, bundle, started
        self.deadline = started + args.deadline_s
        self.model_dir = model_dir
        self.model, self.rope = load_model(model_dir, device=args.device, dtype=bundle.dtype)
        self.windows = {key: torch.from_numpy(tokens) for key, tokens in windows.items()}
        self.scorers: dict[str, Any] = {}
        cuda = args.device.startswith("cuda")
        self.result = TableResult(
            provenance=provenance(),
            device=args.device,
            gpu=torch.cuda.get_device_name() if cuda else None,
            dry_run=not cuda,
            package=str(Path(longrope.workers.__file__).parent.parent),
            gguf_sha256=bundle.gguf.sha256,
            weights_digest=bundle.weights_digest,
            gguf=bundle.gguf.name,
        )

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        out = Path(self.args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        temporary = out.with_name(out.name + ".tmp")
        temporary.write_text(self.result.model_dump_json(indent=1) + "\n")
        os.replace(temporary, out)

    def phase(self, name: str, since: float) -> None:
        self.result.seconds[name] = round(time.monotonic() - since, 2)
        self.save()

    def scorer(self, split: str, length: int):
        from longrope.workers.scorer import Scorer

        key = f"{split}/{length}"
        if key not in self.scorers:
            self.scorers[key] = Scorer(
                self.model, self.windows[key], self.rope.method.original_inv_freq(), candidates_per_forward=1
            )
        return self.scorers[key]

    def context(self, target: int, search: dict | None = None):
        from gpu_table_parts.table import job_context

        return job_context(self.bundle, target, self.model_dir, self.rope, search)

    def timing(self, target: int) -> Timing:
        """Seconds a window of a candidate takes, with YaRN's factors as LongRoPE, after a warm-up on one window (the
        first call at a length also builds that length's kernels): the forward timed on every search window, as a
        candidate is scored (where windows are short, a forward stacks several), the gradient pass on one."""
        context = self.context(target)
        yarn = next(seed for seed in context.seeds() if seed.name == "yarn")
        method = context.candidate(yarn.factors, attention_factor=yarn.attention_factor)
        scorer, windows = self.scorer("search", target), self.bundle.count("search", target)
        scorer.score([method], (0, 1))
        forward = seconds(lambda: scorer.score([method]), repeats=1) / windows
        scorer.score_with_gradient(method, (0, 1))
        gradient = seconds(lambda: scorer.score_with_gradient(method, (0, 1)), repeats=1)
        print(f"timing at {target}: forward {forward:.3f} s, gradient pass {gradient:.3f} s a window", flush=True)
        return Timing(length=target, forward_seconds=forward, gradient_seconds=gradient)

    def baseline_rows(self, target: int) -> None:
        """Tuning on the search windows, then every baseline and the tuned rows on the test windows."""
        from gpu_table_parts.table import MethodScores, tune

        context, since = self.context(target), time.monotonic()
        rule = self.bundle.window_set("test", target).rule
        entry = self.result.targets.setdefault(str(target), TargetResult(target_length=target, test_windows_rule=rule))
        tuned, settings, means = tune(context, self.bundle.grid, MethodScores(self.scorer("search", target)))
        entry.tuning, entry.tuned = means, settings
        test = self.test_scores(target)
        for name, method in {**context.baselines(), **tuned}.items():
            entry.per_window[name] = test.per_window(method)
            print(
                f"{target} {name}: test NLL {sum(entry.per_window[name]) / len(entry.per_window[name]):.4f}", flush=True
            )
        self.phase(f"table {target}", since)

    def test_scores(self, target: int):
        from gpu_table_parts.table import MethodScores

        key = f"scores/{target}"
        if key not in self.scorers:
            self.scorers[key] = MethodScores(self.scorer("test", target))
        return self.scorers[key]

    def search(self, target: int, budget, reserve: float) -> None:
        """One optimizer at one target, until its share of the plan (`--slack` x, 1.25: the timing's noise) or the time
        the rows still to score need."""
        from gpu_table_parts.searching import run_search

        timing = next(t for t in self.result.timings if t.length == target)
        windows = self.bundle.count("search", target)
        share = search_seconds(budget.candidates, budget.backward_steps, [timing], windows)
        until = min(time.monotonic() + self.args.slack * share, self.deadline - reserve)
        print(f"{target} {budget.optimizer}: {budget.candidates} candidates planned, {share:.0f} s", flush=True)
        since = time.monotonic()
        found = run_search(self.context(target, budget.search), self.scorer("search", target), windows, until)
        self.result.targets[str(target)].searches[budget.optimizer] = found.model_dump(mode="json")
        print(
            f"{target} {budget.optimizer}: {found.scored} scored, best search NLL {found.best_search_nll}", flush=True
        )
        self.phase(f"{budget.optimizer} {target}", since)

    def finish(self, target: int) -> None:
        """The searches' bests on the test windows, and compare's table of every row."""
        from gpu_table_parts.table import finish, searched_rows

        context, entry, since = self.context(target), self.result.targets[str(target)], time.monotonic()
        tuned, _ = self.tuned_methods(context, entry)
        searched = searched_rows(context, entry.searches)
        methods = {**context.baselines(), **tuned, **searched}
        for row, method in searched.items():  # a polish that found nothing better: its row takes the GA's scores
            entry.per_window[row] = self.test_scores(target).per_window(method)
        entry.compare, entry.table = finish(context, methods, entry.per_window, dict(entry.tuned))
        print(entry.table, flush=True)
        self.phase(f"rows {target}", since)  # saved before the plot: a lease's numbers never wait on matplotlib
        draw_paired_difference(entry, Path(self.args.out))

    def tuned_methods(self, context, entry: TargetResult):
        """The tuned rows again from the recorded tuning scores (pick_tuned is deterministic: nothing is scored)."""
        from longrope.search.reports.tuned_baselines import pick_tuned, tuning_grids

        return pick_tuned(context, tuning_grids(context, self.bundle.grid), entry.tuning)


def draw_paired_difference(entry: TargetResult, out: Path) -> Path:
    """compare's paired-difference plot of one target's rows, beside the result file (STEM_paired_difference_N.png)."""
    from longrope.search.reports.compare_plots import plot_paired_difference

    path = out.with_name(f"{out.stem}_paired_difference_{entry.target_length}.png")
    plot_paired_difference(entry.compare, path)
    return path


def seconds(call, repeats: int) -> float:
    """Mean seconds of `call` (its result is on the CPU, so the GPU's work is done when it returns)."""
    start = time.monotonic()
    for _ in range(repeats):
        call()
    return (time.monotonic() - start) / repeats


def run_table(args) -> int:
    """The GPU side, end to end; returns the exit status."""
    started = time.monotonic()
    try:
        bundle, windows, state = checked_inputs(Path(args.gguf), Path(args.bundle))
    except Refused as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    model_dir = write_model_dir(state, bundle.config_json, Path(args.work or Path(args.gguf).parent) / "model")
    del state
    converted = time.monotonic()
    run = TableRun(args, bundle, windows, model_dir, started)
    run.result.seconds["check and convert"] = round(converted - started, 2)
    run.phase("load", converted)
    since = time.monotonic()
    run.result.timings = [run.timing(target) for target in bundle.targets]
    run.phase("timing", since)
    from gpu_table_parts.table import tuning_size

    tuning = {target: tuning_size(run.context(target), bundle.grid) for target in bundle.targets}
    run.result.plan = make_plan(
        run.result.timings,
        run.left() - MARGIN_S,
        tuning_settings=tuning,
        search_windows=bundle.counts("search"),
        test_windows=bundle.counts("test"),
        max_generations=args.max_generations,
        max_steps=args.max_steps,
        optimizers=tuple(bundle.optimizers),
        descent=bundle.descent,
    )
    print(f"plan: {run.result.plan.note}", flush=True)
    run.save()
    for target in bundle.targets:
        run.baseline_rows(target)
    for index, target in enumerate(bundle.targets):
        rows_left = sum(2 * bundle.count("test", t.length) * t.forward_seconds for t in run.result.timings[index:])
        for budget in (run.result.plan.ga, run.result.plan.descent):
            if budget is not None:
                run.search(target, budget, reserve=rows_left + MARGIN_S)
        run.finish(target)
    run.result.finished = True
    run.result.seconds["total"] = round(time.monotonic() - started, 2)
    run.save()
    Path(args.out).with_suffix(".md").write_text(run.result.markdown())
    return 0
