"""Rerunning the baselines: every method on the same test windows at several lengths, with intervals.

Methods: none, PI, NTK-aware, Dynamic NTK, YaRN and Llama 3 at their nominal settings for the job's scale;
NTK with its scale and attention factor tuned on the search split (a fair, strong baseline); and any factors
files given. Perplexity intervals are 95% normal intervals over windows of the per-window mean NLL; the
paired difference to the best baseline uses the same windows on both sides, which removes most of the
window-to-window variance (about 10x tighter than comparing two perplexities). Next to perplexity, needle
retrieval on held-out needles of the test split (`needle_report.py`): exact-match accuracy and answer NLL per
length and depth, and a depth x length heat-map.

Each given factors file is a row labelled `file:`/`run:` plus the shortest path suffix that tells it apart from the
other given paths, or the NAME of `--label NAME=PATH`. Each run writes into a directory of its own
(`CompareOut`), so a second compare never overwrites the first one's results.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from longrope.encodings import LongRope, NtkRope, RopeMethod
from longrope.search.config.factors_file import FactorsFile, factors_encoding
from longrope.search.config.job_config import JobConfigError
from longrope.search.export.factors_export import factors_of_path
from longrope.search.reports.intervals import interval, paired_difference
from longrope.search.reports.needle_report import needle_cell, needle_table, plot_needle_heatmap
from longrope.search.run.job_context import JobContext, data_source_checks
from longrope.search.run.run_store import CONFIG, RunDir, RunStoreError, write_json_atomic, write_text_atomic
from longrope.workers.errors import DataError
from longrope.workers.pool import WorkerPool
from longrope.workers.windows import Windows

BASELINES = ("none", "pi", "ntk", "dynamic", "yarn", "llama3", "ntk_tuned")
NTK_SCALE_MULTIPLIERS = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)
NTK_ATTENTION_FACTORS = (1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3)
Progress = Callable[[str, int, int], None]  # (phase, results done, results in the phase)
VLLM_SUFFIX = "(vLLM)"  # a row as a vLLM engine with max_model_len = the target applies the method
OUTPUT_FILES = ("compare.json", "compare.md", "perplexity_vs_length.png", "factors.png", "needle_heatmap.png")


def no_progress(phase: str, done: int, total: int) -> None:
    """The default: compare says nothing between its log lines."""


def default_lengths(original: int, target: int) -> list[int]:
    lengths, length = [], original
    while length < target:
        lengths.append(length)
        length *= 2
    return [*lengths, target]


def window_means(score) -> np.ndarray:
    return np.asarray(score.nll, dtype=np.float64) / np.asarray(score.tokens, dtype=np.float64)


def score_all(
    context: JobContext,
    methods: dict[str, RopeMethod],
    source: str,
    length: int,
    count: int,
    objective: str = "perplexity",
) -> dict:
    """Every method on one window set, with a pool of its own (benches that score one set)."""
    windows = context.windows(source, length, count, objective)
    pool = WorkerPool(context.model_spec(), windows.tokens, context.pool_spec(), loss_mask=windows.loss_mask)
    try:
        return dict(pool.imap(methods.items()))
    finally:
        pool.shutdown()


def compare_window_sets(context: JobContext, lengths: list[int], log) -> dict[tuple[str, int], Windows]:
    """Every window set compare scores, read before any worker starts (a bad source fails here): the search
    split at the target length (to tune NTK), and per length the test split's perplexity and needle windows
    (none where a needle cannot fit)."""
    data = context.config.data
    data_source_checks(context.config)  # as validate checks them: a bad source stops here, before any cache write
    sets = {
        ("tuning", context.target_length): context.windows(
            data.search_source, context.target_length, data.search_windows
        )
    }
    for length in lengths:
        sets[("perplexity", length)] = context.windows(data.test_source, length, data.test_windows)
        try:
            sets[("needle", length)] = context.windows(data.test_source, length, data.test_windows, "needle")
        except DataError as exc:
            log(f"compare: no needle retrieval at {length} tokens ({exc})")
    return sets


class ComparePool:
    """One worker pool for all of compare's window sets: each worker loads the model once, not once per length
    and objective."""

    def __init__(self, context: JobContext, sets: dict[tuple[str, int], Windows]):
        self.pool = WorkerPool(
            context.model_spec(),
            [w.tokens for w in sets.values()],
            context.pool_spec(),
            loss_mask=[w.loss_mask for w in sets.values()],
        )
        self.spans = dict(zip(sets, self.pool.spans, strict=True))

    def score(
        self, methods: dict, set_names: list[tuple[str, int]], progress: Progress = no_progress, phase: str = "scored"
    ) -> dict[tuple[str, int], dict]:
        """Each method on each named set: {set: {method: CandidateScore}}, methods in the order given; `progress`
        hears (phase, results done, results in all) as each result arrives."""
        for set_name in set_names:
            self.pool.submit((((set_name, name), method) for name, method in methods.items()), self.spans[set_name])
        scores: dict = {set_name: {} for set_name in set_names}
        total = len(methods) * len(set_names)
        for done, ((set_name, name), score) in enumerate(self.pool.as_completed(), start=1):
            scores[set_name][name] = score
            progress(phase, done, total)
        return {set_name: {name: scores[set_name][name] for name in methods} for set_name in set_names}

    def shutdown(self) -> None:
        self.pool.shutdown()


def ntk_grid(context: JobContext) -> dict[tuple[float, float], RopeMethod]:
    """NTK at several scales and attention factors, each as LongRoPE factors at the target length."""
    shape = {
        "head_dim": context.method.head_dim,
        "rope_theta": context.method.rope_theta,
        "partial_rotary_factor": context.method.partial_rotary_factor,
        "max_position_embeddings": context.target_length,
    }
    grid = {}
    for multiplier in NTK_SCALE_MULTIPLIERS:
        factors = NtkRope(factor=context.scale * multiplier, **shape).factors().double()
        for attention in NTK_ATTENTION_FACTORS:
            grid[(multiplier, attention)] = context.longrope(factors, attention_factor=attention)
    return grid


def tuned_ntk(
    context: JobContext, pool: ComparePool, progress: Progress = no_progress
) -> tuple[RopeMethod, dict[str, float]]:
    """NTK's scale and attention factor picked on the search split at the target length."""
    grid = ntk_grid(context)
    tuning = ("tuning", context.target_length)
    methods = {str(key): method for key, method in grid.items()}
    scores = pool.score(methods, [tuning], progress, phase="NTK settings tried")[tuning]
    best = min(grid, key=lambda key: scores[str(key)].mean_nll)
    multiplier, attention = best
    # as it would be exported: its scale in the keys vLLM reads too, so its vLLM row differs only by regime
    tuned = grid[best].for_both_runtimes()
    return tuned, {"ntk_factor": context.scale * multiplier, "attention_factor": attention}


def factors_method(context: JobContext, path: str, log=print) -> tuple[RopeMethod, int, str]:
    """A factors file, or a run directory (its best candidate, as `longrope export` writes it), as a row of this
    job: (its encoding, the target length it was searched for, the field that says so), its provenance checked
    against the job first (`check_provenance`)."""
    factors = factors_of_path(path)
    where = f"--factors {path}"
    searched, field = check_provenance(context, factors, where, log)
    method = factors_encoding(factors, head_dim=context.method.head_dim, pairs=context.pairs, source=where)
    return method, searched, field


def check_provenance(context: JobContext, factors: FactorsFile, where: str, log) -> tuple[int, str]:
    """Refuse factors of another model, before anything is scored: their original length (provenance's when
    given, and the block's `original_max_position_embeddings`, which runtimes read), their rope_theta, and the
    model provenance names, by its directory's name, since a model is found under other paths on other machines
    (the shipped demo factors name the reference model under the clone they were searched in). A file without
    provenance.model (`longrope encodings factors` writes none) has its RoPE checked only, and a line says so.
    Returns the target length the factors were searched for (provenance's, else `max_position_embeddings`) and
    the field it was read from: another length than the job's is compared, under a label that says it."""
    extra = factors.provenance.model_extra or {}
    block = factors.rope_parameters
    for field, value in (
        ("provenance.original_length", extra.get("original_length")),
        ("rope_parameters.original_max_position_embeddings", block.original_max_position_embeddings),
    ):
        if value is not None and value != context.original_length:
            raise JobConfigError(
                f"{where}: original length {value} ({field}), this job's is {context.original_length}; "
                "factors of another model"
            )
    if not math.isclose(block.rope_theta, context.method.rope_theta, rel_tol=1e-9):
        raise JobConfigError(
            f"{where}: rope_theta {block.rope_theta:g} (rope_parameters.rope_theta), this job's model has "
            f"{context.method.rope_theta:g}; factors of another model"
        )
    model = extra.get("model")
    if model is None:
        log(
            f"compare: {where}: no provenance.model ({factors.provenance.created_by}); its model is not checked, "
            "only its RoPE (rotary pairs, rope_theta, original length)"
        )
    elif model_name(model) != model_name(context.model_dir):
        raise JobConfigError(
            f"{where}: made for model {model_name(model)!r} (provenance.model {str(model)!r}); this job's model "
            f"is {model_name(context.model_dir)!r} (model.path {context.config.model.path!r}); compare it in a job "
            "of its model"
        )
    if extra.get("target_length") is not None:
        return int(extra["target_length"]), "provenance.target_length"
    return factors.max_position_embeddings, "max_position_embeddings"


def model_name(model_dir: str | Path) -> str:
    """A model directory's name, the part of its path that travels between machines: the folder's own name, or
    for a Hugging Face cache snapshot (models--ORG--NAME/snapshots/REVISION) the repository's folder, so two
    revisions of one model are one model."""
    path = Path(str(model_dir))
    return path.parent.parent.name if path.parent.name == "snapshots" else path.name


def given_methods(context: JobContext, rows: dict[str, str], log) -> tuple[dict[str, RopeMethod], dict[str, int]]:
    """The given factors' rows, {label: encoding}, and {label: the target length each was searched for}. A row
    searched for another length than the job's is scored as it is, at the job's lengths, under its label plus
    `@LENGTH`, with one line saying so: its factors are not this target's, and a bare label would read as if they
    were (a 512 export in a 1024 comparison scores worse than YaRN, which is no news about the search)."""
    methods: dict[str, RopeMethod] = {}
    searched_lengths: dict[str, int] = {}
    for label, path in rows.items():
        method, searched, field = factors_method(context, path, log)
        if searched != context.target_length:
            label = f"{label}@{searched}"
            log(
                f"compare: --factors {path}: searched for {searched} tokens ({field}), not this job's target "
                f"({context.target_length}); its row is {label}"
            )
        if label in methods:
            raise JobConfigError(f"compare: two rows labelled {label!r}; give one of them another NAME with --label")
        methods[label], searched_lengths[label] = method, searched
    return methods, searched_lengths


def needle_cell_of(score) -> dict[str, Any]:
    return needle_cell(list(score.misses), list(score.nll), list(score.tokens))


def factors_rows(sources: Sequence[str | Path | tuple[str, ...]]) -> dict[str, str]:
    """{row label: path} for the given factors files and run directories, in the order given.

    A plain path is labelled `file:` (a factors JSON) or `run:` (a run directory) plus the shortest suffix of its
    path that no other given path shares: one file keeps its bare name, a/factors.json and b/factors.json become
    file:a/factors.json and file:b/factors.json. A (NAME, PATH) pair (`--label NAME=PATH`) is labelled NAME.
    Rows are keyed by label, so one file given twice or two equal labels would silently drop a row: both are
    refused here, before any file is read or anything scored."""
    pairs = [_label_pair(source) for source in sources]
    _refuse_same_file_twice([path for _, path in pairs])
    plain = [path for label, path in pairs if label is None]
    automatic = iter(_distinguishing_labels(plain))
    rows: dict[str, str] = {}
    for label, path in pairs:
        label = next(automatic) if label is None else label
        if label in rows:
            raise JobConfigError(
                f"compare: two rows labelled {label!r} ({rows[label]} and {path}); give one of them another NAME "
                "with --label NAME=PATH"
            )
        rows[label] = path
    return rows


def _label_pair(source: str | Path | tuple[str, ...]) -> tuple[str | None, str]:
    """(label, path): (None, path) for a plain path; a `--label NAME=PATH` pair checked for a usable NAME (a row
    of its own, a markdown table cell, not mistakable for a baseline or a derived vLLM row)."""
    if not isinstance(source, tuple):
        return None, str(source)
    if len(source) != 2 or not all(part.strip() for part in source):
        raise JobConfigError(f"--label {'='.join(source)!r}: expected NAME=PATH")
    name, path = source[0].strip(), source[1]
    if name in BASELINES:
        raise JobConfigError(f"--label {name}={path}: {name!r} is a baseline's row; pick another NAME")
    if name.endswith(VLLM_SUFFIX):
        raise JobConfigError(f"--label {name}={path}: a NAME ending in {VLLM_SUFFIX!r} marks a derived vLLM row")
    if "|" in name or not name.isprintable():
        raise JobConfigError(f"--label {name!r}: NAME must be printable and without '|' (it is a markdown table cell)")
    return name, path


def _refuse_same_file_twice(paths: list[str]) -> None:
    seen: dict[Path, str] = {}
    for path in paths:
        real = Path(os.path.realpath(path))  # never raises: a link loop stays as given, and is named when read
        if real in seen:
            given = f"{path!r} is given twice" if seen[real] == path else f"{seen[real]!r} and {path!r} are one file"
            raise JobConfigError(f"compare: {given}; give each factors file or run directory once")
        seen[real] = path


def _kind(path: str) -> str:
    return "run:" if os.path.isdir(path) else "file:"  # False for what cannot be stat'ed; read_factors_file says why


def _distinguishing_labels(paths: list[str]) -> list[str]:
    """`file:`/`run:` plus, per path, the fewest trailing path components that no other path ends in (compared at
    the same depth, so labels of different depths differ too). Distinct absolute paths always get distinct labels:
    at worst the whole path."""
    keys = [(_kind(path), Path(os.path.abspath(path)).parts) for path in paths]
    labels = []
    for i, (kind, parts) in enumerate(keys):
        others = [key for j, key in enumerate(keys) if j != i]
        depth = next(
            k for k in range(1, len(parts) + 1) if all((o_kind, o[-k:]) != (kind, parts[-k:]) for o_kind, o in others)
        )
        labels.append(kind + str(Path(*parts[-depth:])))
    return labels


class CompareOut:
    """Where one compare run writes its results.

    `-o DIR` (`path`): that directory, refused when it already holds anything unless `overwrite`, since a run into
    it would replace another run's results. Default (`parent`): a fresh `<prefix>-<YYYYmmdd-HHMMSS>` in `parent`
    (see `default_out` for which folder and prefix), named by the run's start time (sorted in time, and it says
    when; `-2`, `-3`... when the name is taken), made exclusively so that two runs never share one. `check` runs
    before anything is scored (a bad directory costs nothing); `create` only once the results are in, so a failed
    or stopped run leaves no empty directory behind."""

    def __init__(
        self,
        path: Path | None = None,
        *,
        parent: Path | None = None,
        prefix: str = "compare",
        overwrite: bool = False,
        started: datetime | None = None,
    ):
        if (path is None) == (parent is None):
            raise ValueError("CompareOut: give a path (-o) or a parent (a fresh directory in it)")
        self.path, self.parent, self.prefix, self.overwrite = path, parent, prefix, overwrite
        self.stamp = (started or datetime.now()).strftime("%Y%m%d-%H%M%S")

    @classmethod
    def default_out(cls, output_dir: Path) -> CompareOut:
        """Where a compare without -o writes: a fresh compare-<time> in the job's output_dir, unless output_dir is a
        run directory (it holds a search's config.json: the demo config's runs/demo, or the run a compare took its
        job from). A run directory belongs to its search, whose files and status it holds, and is deleted with it
        (`make demo` starts with rm -rf), so the results go beside it instead: <run>-compare-<time> in its parent
        folder, named for the run they compare."""
        if not RunDir(output_dir).file(CONFIG).exists():
            return cls(parent=output_dir)
        run = Path(os.path.abspath(output_dir))
        return cls(parent=run.parent, prefix=f"{run.name}-compare")

    def check(self) -> None:
        if self.path is None:
            _check_creatable(self.parent, "output_dir")
            return
        if self.path.exists() and not self.path.is_dir():
            raise JobConfigError(f"--out-dir {self.path}: exists and is not a directory")
        held = sorted(entry.name for entry in self.path.iterdir()) if self.path.is_dir() else []
        if held and not self.overwrite:
            shown = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
            raise JobConfigError(
                f"--out-dir {self.path}: not empty (holds {shown}); give --overwrite to replace the files "
                "there, or another directory"
            )
        _check_creatable(self.path, "--out-dir")

    def create(self) -> Path:
        try:
            if self.path is not None:
                self.path.mkdir(parents=True, exist_ok=True)
                return self.path
            self.parent.mkdir(parents=True, exist_ok=True)
            for attempt in range(1, 10_000):
                candidate = self.parent / (f"{self.prefix}-{self.stamp}" + (f"-{attempt}" if attempt > 1 else ""))
                try:
                    candidate.mkdir()
                except FileExistsError:
                    continue
                self.path = candidate
                return candidate
        except OSError as exc:
            raise RunStoreError(f"{self.path or self.parent}: cannot create ({exc.strerror or exc})") from None
        raise RunStoreError(f"{self.parent}: every {self.prefix}-{self.stamp}-N name is taken")


def _check_creatable(path: Path, what: str) -> None:
    """A directory compare can create or write into: its nearest existing ancestor is a writable directory."""
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise JobConfigError(f"{what} {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise JobConfigError(f"{what} {path}: {existing} is not writable")


def check_lengths(lengths: list[int]) -> None:
    bad = [n for n in lengths if n < 2]
    if bad:
        raise JobConfigError(f"--lengths: every length must be >= 2, got {bad[0]}")


def with_vllm_rows(methods: dict[str, RopeMethod]) -> dict[str, RopeMethod]:
    """Each LongRoPE method (searched factors, tuned NTK) once more as a vLLM engine with max_model_len = the
    target applies it: long factors and long_mscale at every length. The other methods have no regimes and
    apply the same in both runtimes."""
    rows = dict(methods)
    for name, method in methods.items():
        if isinstance(method, LongRope):
            rows[f"{name} {VLLM_SUFFIX}"] = method.vllm_regime()
    return rows


def run_compare(
    context: JobContext,
    *,
    factors_files: Sequence[str | Path | tuple[str, ...]],
    lengths: list[int],
    out_dir: Path | CompareOut,
    log=print,
    progress: Progress = no_progress,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """Score every baseline and the given factors (paths, or (label, path) pairs) and write the results;
    `progress(phase, done, total)` hears each result (the CLI draws a bar or prints lines from it).

    Every input is checked before any window is cut or anything scored: lengths, row labels, the factors files
    and their provenance, the output directory, then both data sources (`compare_window_sets`). `notes` (the
    caller's) and what provenance says (another target length, a model not checked) are logged only then, so a
    refusal stays the only line. A plain `out_dir` path is `-o` without --overwrite. The output directory is
    created only when the results are in."""
    check_lengths(lengths)
    rows = factors_rows(factors_files)
    notes = list(notes)  # said once every input has passed its check
    files, searched_lengths = given_methods(context, rows, notes.append)
    out = out_dir if isinstance(out_dir, CompareOut) else CompareOut(Path(out_dir))
    out.check()
    sets = compare_window_sets(context, lengths, log)
    for note in notes:
        log(note)
    methods, scores, tuned = score_methods(context, sets, files, lengths, log, progress)
    per_window = {
        name: {n: window_means(scores[("perplexity", n)][name]).tolist() for n in lengths} for name in methods
    }
    result = summarize(context, methods, per_window, lengths, tuned, searched_lengths)
    needle_lengths = [n for kind, n in scores if kind == "needle"]
    for name, row in result["methods"].items():
        row["needle"] = {str(n): needle_cell_of(scores[("needle", n)][name]) for n in needle_lengths}
    write_outputs(result, out.create())
    return result


def score_methods(
    context: JobContext,
    sets: dict,
    files: dict[str, RopeMethod],
    lengths: list[int],
    log,
    progress: Progress = no_progress,
):
    """(methods, scores, tuned NTK's settings): the baselines, NTK tuned on the search split, the given factors
    and the vLLM twins, each on every test window set, with one worker pool; `progress` hears each result."""
    pool = ComparePool(context, sets)
    try:
        methods: dict[str, RopeMethod] = dict(context.baselines())
        log("compare: tuning NTK's scale and attention factor on the search split ...")
        methods["ntk_tuned"], tuned = tuned_ntk(context, pool, progress)
        methods = with_vllm_rows({**methods, **files})
        scored = [name for name in sets if name[0] != "tuning"]
        log(
            f"compare: scoring {len(methods)} methods at {', '.join(map(str, lengths))} tokens "
            "(perplexity and needles, one worker pool) ..."
        )
        return methods, pool.score(methods, scored, progress, phase="method x window sets scored"), tuned
    finally:
        pool.shutdown()


def write_outputs(result: dict[str, Any], directory: Path) -> None:
    """OUTPUT_FILES into `directory`; the JSON and the table atomically (a reader never sees half of either)."""
    write_json_atomic(directory / "compare.json", result)
    write_text_atomic(directory / "compare.md", markdown_table(result) + "\n\n" + needle_table(result) + "\n")
    plot_perplexity(result, directory / "perplexity_vs_length.png")
    plot_factors(result, directory / "factors.png")
    plot_needle_heatmap(result, directory / "needle_heatmap.png")


def summarize(context, methods, per_window, lengths, tuned, searched_lengths=None) -> dict[str, Any]:
    """compare.json. A given factors row (and its vLLM twin) records `factors_target_length`, the length its
    factors were searched for (`given_methods`)."""
    searched_lengths = searched_lengths or {}
    target = context.target_length
    baseline_names = [n for n in methods if n in BASELINES]
    best_baseline = min(
        baseline_names, key=lambda n: np.mean(per_window[n][target]) if target in per_window[n] else math.inf
    )
    rows = {}
    for name, method in methods.items():
        row: dict[str, Any] = {
            "runtime": "vllm" if name.endswith(VLLM_SUFFIX) else "transformers",
            "perplexity": {},
            "factors": method.factors(target).tolist(),
            "attention_factor": method.attention_factor,
            "nll_per_window": per_window[name],
        }
        if base_method(name) in searched_lengths:
            row["factors_target_length"] = searched_lengths[base_method(name)]
        for length in lengths:
            mean, low, high = interval(np.asarray(per_window[name][length]))
            row["perplexity"][str(length)] = [math.exp(mean), math.exp(low), math.exp(high)]
        if target in per_window[name]:
            row["paired_difference_to_best_baseline"] = list(
                paired_difference(per_window[name][target], per_window[best_baseline][target])
            )
        rows[name] = row
    first = next(iter(per_window.values()))
    return {
        "target_length": target,
        "original_length": context.original_length,
        "lengths": lengths,
        "windows": {str(n): len(first[n]) for n in lengths},
        "rope": {"rope_theta": context.method.rope_theta, "pairs": context.pairs},
        "best_baseline": best_baseline,
        "ntk_tuned": tuned,
        "methods": rows,
    }


def window_counts(result: dict[str, Any]) -> dict[str, int]:
    """Test windows per length: compare.json's `windows`, or (an older result) the per-window NLLs of a row."""
    if "windows" in result:
        return {str(n): int(count) for n, count in result["windows"].items()}
    row = next(iter(result["methods"].values()))
    per_window = {str(n): values for n, values in row["nll_per_window"].items()}
    return {str(n): len(per_window[str(n)]) for n in result["lengths"]}


def describe_windows(counts: dict[str, int]) -> str:
    if len(set(counts.values())) == 1:
        return f"{next(iter(counts.values()))} windows at every length"
    return "windows per length: " + ", ".join(f"{n}: {count}" for n, count in counts.items())


def markdown_table(result: dict[str, Any]) -> str:
    """compare.md's perplexity table, with what it measures, its units, how many windows and which way is better
    written above it (the table is read away from the code), and the best value of each column in bold."""
    lengths, target, best = result["lengths"], result["target_length"], result["best_baseline"]
    header = ["method", *[f"ppl @ {n}" for n in lengths], f"Δ NLL vs {best} @ {target}"]
    rows = result["methods"]
    perplexities = [_column_cells([row["perplexity"][str(n)] for row in rows.values()], "{:.3f}") for n in lengths]
    differences = _column_cells([row.get("paired_difference_to_best_baseline") for row in rows.values()], "{:+.4f}")
    cells = [*perplexities, differences]
    lines = [
        f"Test split, {describe_windows(window_counts(result))}. **Lower is better** in every column. "
        "ppl: perplexity = exp(mean NLL per token over the windows), with its 95% interval over windows. "
        f"Δ NLL: mean paired difference in NLL per token (nats/token) to {best}, the best baseline at {target} "
        f"tokens, on the same windows (negative: better than {best}), with its 95% interval. "
        "**Bold**: the best value of its column.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for k, name in enumerate(rows):
        lines.append("| " + " | ".join([name, *[column[k] for column in cells]]) + " |")
    if any(row.get("runtime") == "vllm" for row in rows.values()):
        lines += [
            "",
            f"Rows marked {VLLM_SUFFIX}: the method as a vLLM engine with max_model_len = {target} applies it, "
            "long factors and long_mscale at every length (vLLM fixes the regime per engine; transformers switches "
            "to the long factors only past the original length). The other methods apply the same in both.",
        ]
    return "\n".join(lines)


def _column_cells(column: list, number: str) -> list[str]:
    """One column's cells, "value [low, high]", the lowest value in bold (every row that shows it, ties too)."""
    best = min((cell[0] for cell in column if cell and math.isfinite(cell[0])), default=None)
    best_text = number.format(best) if best is not None else None
    out = []
    for cell in column:
        if not cell:
            out.append("-")
            continue
        value = number.format(cell[0])
        shown = f"**{value}**" if value == best_text else value
        out.append(f"{shown} [{number.format(cell[1])}, {number.format(cell[2])}]")
    return out


# Plots. Each returns its matplotlib Figure (built without pyplot: no global state, nothing to close) and saves it
# when given a path; tests read axes, ticks and artists from the figure.

PPL_BAND = 3.0  # the perplexity plot shows every point within this factor of the best method at its length
DODGE_OCTAVES = 0.012  # methods' points at one length sit this far apart, so their error bars do not overlap
TICK_MANTISSAS = (
    (1, 2, 5),
    (1, 2, 3, 5),
    (1, 1.5, 2, 3, 4, 5, 7),
    (1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 6, 7, 8, 9),
)


def base_method(name: str) -> str:
    return name.removesuffix(f" {VLLM_SUFFIX}")


def is_given(name: str) -> bool:
    """A row of a given factors file (labels never take a baseline's name), drawn thicker than the baselines."""
    return base_method(name) not in BASELINES


def method_colours(names) -> dict[str, str]:
    """One colour per method, shared by its (vLLM) twin: colours follow the order of the base names in the
    result, so the perplexity, factors and needle plots of one result agree. Grey is left out: it is the colour
    of the plots' reference lines."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    bases = list(dict.fromkeys(base_method(name) for name in names))
    if len(bases) <= 9:
        palette = [colormaps["tab10"](k) for k in range(10) if k != 7]
    else:
        palette = [colormaps["tab20"](k) for k in range(20) if k not in (14, 15)]
    return {name: to_hex(palette[bases.index(base_method(name)) % len(palette)]) for name in names}


def nice_ticks(low: float, high: float, most: int = 10) -> list[float]:
    """Ticks for a log axis as plain numbers: the finest 1-2-5-like series with at most `most` ticks in range."""
    decades = range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1)
    chosen: list[float] = []
    for mantissas in TICK_MANTISSAS:
        ticks = sorted({float(f"{m * 10.0**d:.6g}") for d in decades for m in mantissas if low <= m * 10.0**d <= high})
        if len(ticks) > most and chosen:
            break
        chosen = ticks
    return chosen


def _log_axis(axis, low: float, high: float) -> None:
    """A log axis labelled with plain numbers (no 10^x, no unlabeled minor ticks)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    axis.set_major_locator(FixedLocator(nice_ticks(low, high)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_locator(NullLocator())


def perplexity_band(result: dict[str, Any]) -> tuple[float, float]:
    """(bottom, top) of the perplexity plot: every point within PPL_BAND x the best method at its length, with
    its interval."""
    bottoms, tops = [], []
    for n in result["lengths"]:
        cells = [row["perplexity"][str(n)] for row in result["methods"].values()]
        cells = [cell for cell in cells if math.isfinite(cell[0])]
        if not cells:
            continue
        best = min(cell[0] for cell in cells)
        for ppl, low, high in cells:
            if ppl <= PPL_BAND * best:
                bottoms.append(low if math.isfinite(low) and low > 0 else ppl)
                tops.append(high if math.isfinite(high) else ppl)
    if not tops:
        return 1.0, 10.0
    return min(bottoms) / 1.04, max(tops) * 1.04


def plot_perplexity(result: dict[str, Any], path: Path | None = None):
    """Test perplexity against context length, log-log, one colour per method ((vLLM) twins dashed in the same
    colour, given factors thicker), 95% intervals as error bars (methods nudged apart along x so that their bars do
    not hide each other), the original and target lengths as dotted lines named on the x axis.

    The y range is clipped to the band that holds every point within PPL_BAND x the best method at its length
    (`perplexity_band`): one method far off (PI at ~30 where the rest sit at 3-6) would otherwise squash the band
    where the methods differ into a sliver. A point above it is drawn as a triangle on the top edge in its
    method's colour with its value written beside it; compare.md has every number. One axis (not a broken or
    second one) keeps every drawn point comparable at a glance."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 5.5), layout="constrained")
    ax = fig.add_subplot()
    lengths, names = result["lengths"], list(result["methods"])
    colours = method_colours(names)
    bottom, top = perplexity_band(result)
    off_scale: dict[int, list] = {n: [] for n in lengths}
    for k, name in enumerate(names):
        row = result["methods"][name]
        ppl, low, high = (np.array([row["perplexity"][str(n)][i] for n in lengths], dtype=float) for i in range(3))
        shown = np.where(np.isfinite(ppl) & (ppl <= top), ppl, np.nan)
        x = np.asarray(lengths, dtype=float) * 2.0 ** ((k - (len(names) - 1) / 2) * DODGE_OCTAVES)
        bars = ax.errorbar(
            x,
            shown,
            yerr=_error_bars(shown, low, high),
            color=colours[name],
            linestyle="--" if row.get("runtime") == "vllm" else "-",
            linewidth=2.4 if is_given(name) else 1.3,
            marker="o",
            markersize=4,
            capsize=3,
            elinewidth=1,
            label=name,
        )
        bars.lines[0].set_gid(name)
        for n, xi, value in zip(lengths, x, ppl, strict=True):
            if not value <= top:
                off_scale[n].append((value, name, xi))
    _mark_off_scale(ax, off_scale, top, colours, last=lengths[-1])
    ax.set_xscale("log")
    ax.set_yscale("log")
    span = [*lengths, result["original_length"], result["target_length"]]
    ax.set_xlim(min(span) / 1.25, max(span) * 1.25)
    ax.set_ylim(bottom, top)
    _mark_lengths(ax, lengths, result["original_length"], result["target_length"])
    _log_axis(ax.yaxis, bottom, top)
    ax.set_xlabel("context length (tokens, log scale)")
    ax.set_ylabel("test perplexity (log scale; lower is better)")
    ax.set_title(
        "perplexity = exp(mean NLL per token) vs length; bars: 95% intervals over windows; "
        f"▲: above {top:.3g}, value written",
        fontsize=10,
    )
    ax.grid(True, which="major", axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="method")
    return _save(fig, path)


def _error_bars(shown: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """[below, above] for errorbar; an infinite bound (one window) draws no bar rather than an infinite one."""
    below = np.where(np.isfinite(low), shown - low, 0.0)
    above = np.where(np.isfinite(high), high - shown, 0.0)
    return np.vstack([np.clip(below, 0, None), np.clip(above, 0, None)])


def _mark_off_scale(ax, off_scale: dict[int, list], top: float, colours: dict[str, str], *, last: int) -> None:
    """A triangle on the top edge per point above the band, its method and value beside it, stacked per length
    (the highest first); at the last length the text goes left, into the plot."""
    for n, points in off_scale.items():
        for rank, (value, name, x) in enumerate(sorted(points, key=lambda p: -p[0] if math.isfinite(p[0]) else -1e300)):
            ax.plot([x], [top], marker="^", markersize=8, color=colours[name], linestyle="none", clip_on=False)
            ax.annotate(
                f"{name} {value:.1f}",
                xy=(x, top),
                xytext=(-7 if n == last else 7, -9 - 10 * rank),
                textcoords="offset points",
                ha="right" if n == last else "left",
                va="center",
                fontsize=7,
                color=colours[name],
                gid=f"off-scale:{name}@{n}",
            )


def _mark_lengths(ax, lengths: list[int], original: int, target: int) -> None:
    """Dotted vertical lines at the original (trained) and target lengths, named in their tick labels (always
    ticked, also when --lengths leaves them out); the other ticks are the lengths scored."""
    from matplotlib.ticker import NullLocator

    names = {original: "original", target: "target"}
    for length, word in names.items():
        ax.axvline(length, color="0.35", linestyle=":", linewidth=1.2, zorder=0, gid=f"{word}_length")
    ticks = sorted({*lengths, original, target})
    ax.set_xticks(ticks, [f"{n}\n({names[n]})" if n in names else str(n) for n in ticks])
    ax.xaxis.set_minor_locator(NullLocator())


def plot_factors(result: dict[str, Any], path: Path | None = None):
    """Per-pair factors at the target length, one line per method in its perplexity-plot colour, with its
    attention factor in the legend (the cos/sin scale: the same factors with another attention factor score
    differently). Dotted lines mark the pairs whose wavelength equals the original and the target length (from
    compare.json's `rope`): pairs left of the first complete many turns within the trained length, pairs right of
    the second never complete one within the target. Unscaled (all ones) and Dynamic NTK (factors that depend on
    the length) are left out; a (vLLM) row has its method's factors."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 5.5), layout="constrained")
    ax = fig.add_subplot()
    colours = method_colours(result["methods"])
    values: list[float] = []
    for name, row in result["methods"].items():
        if name in ("none", "dynamic") or row.get("runtime") == "vllm":
            continue
        ax.plot(
            row["factors"],
            color=colours[name],
            linewidth=2.4 if is_given(name) else 1.3,
            marker=".",
            label=f"{name} (attn {row['attention_factor']:.3f})",
            gid=name,
        )
        values += [v for v in row["factors"] if math.isfinite(v) and v > 0]
    _mark_wavelengths(ax, result)
    ax.set_yscale("log")
    low, high = (min(values), max(values)) if values else (1.0, 2.0)
    ax.set_ylim(low / 1.1, high * 1.1)
    _log_axis(ax.yaxis, low / 1.1, high * 1.1)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("rotary pair index i (high frequency -> low)")
    ax.set_ylabel("factor λ_i (inv_freq divisor, log scale)")
    ax.set_title(factors_title(result), fontsize=10)
    ax.grid(True, which="major", axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="method (attention factor)")
    return _save(fig, path)


def factors_title(result: dict[str, Any]) -> str:
    """The factors plot's title: the job's target length, and each other length a given row was searched for
    (its label ends in @LENGTH, see `given_methods`), so no line reads as factors for the target it is not."""
    target = result["target_length"]
    others = sorted({row.get("factors_target_length", target) for row in result["methods"].values()} - {target})
    title = f"per-pair factors at the target length, {target} tokens"
    return title + "".join(f"; @{n}: searched for {n} tokens, applied as they are" for n in others)


def _mark_wavelengths(ax, result: dict[str, Any]) -> None:
    """Pair i has wavelength 2π θ^(i/pairs): a dotted line where it equals the original and the target length."""
    rope = result.get("rope")
    if not rope:
        return
    pairs, theta = rope["pairs"], rope["rope_theta"]
    for length, word in ((result["original_length"], "original"), (result["target_length"], "target")):
        index = pairs * math.log(length / (2 * math.pi)) / math.log(theta)
        if 0 <= index <= pairs - 1:
            ax.axvline(index, color="0.35", linestyle=":", linewidth=1.2, zorder=0, gid=f"{word}_length")
            ax.text(
                index,
                0.98,
                f" wavelength = {word} length ({length})",
                transform=ax.get_xaxis_transform(),
                rotation=90,
                ha="right",
                va="top",
                fontsize=8,
                color="0.25",
            )


def _save(fig, path: Path | None):
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
