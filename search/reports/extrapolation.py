"""`longrope extrapolation`: every trained positional encoding of the suite read at 1x to 16x its training length.

Six checkpoints of one decoder (`workers.suite_model`), trained alike and differing only in how position
enters (sinusoidal, learned, ALiBi, CoPE, NoPE, RoPE), plus the RoPE checkpoint read with each context-extension
method of the encodings' registry at its nominal setting for the length it is read at (PI, NTK, Dynamic NTK, YaRN,
Llama 3: `encodings.baselines`) and with searched LongRoPE factors (by default the demo's, which were searched on the
reference model of the same shape).

Every length predicts the same tokens: the first `16 x train_length` tokens after the first of each of N held-out
documents (the corpus's test split), read in windows of `length + 1` tokens that share their edge token, so a
length changes only how much context each prediction sees. Perplexity is exp of the mean NLL per token; the 95%
interval is over documents (a document's windows are averaged first: windows of one document are not
independent samples, documents are). A learned table has no row past its last position: that cell is run, fails
with the table's own error and is reported as cannot run, with `perplexity` null.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, TypeAdapter

from longrope.encodings.baselines import baseline_methods, closed_forms
from longrope.encodings.errors import PositionOutOfRangeError
from longrope.encodings.rope_methods import RopeMethod
from longrope.search.config.factors_file import FactorsFile, factors_encoding
from longrope.search.config.strict import JobConfigError
from longrope.search.reports.intervals import interval
from longrope.search.reports.plot_axes import log_axis
from longrope.search.run.run_store import write_text_atomic
from longrope.workers.errors import DataError

MULTIPLES = (1, 2, 4, 8, 16)
OUTPUT_FILES = ("extrapolation.json", "extrapolation.md", "extrapolation.png")
# every closed form but plain RoPE (the rope checkpoint as trained is its `none` row), then the searched factors
ROPE_EXTENSIONS = (*(name for name, cls in closed_forms().items() if cls is not RopeMethod), "longrope")
# How the guide this project starts from rates each method's extrapolation (its words, and ours for them).
GUIDE_WORDS = {
    ("sinusoidal", "none"): "差 poor",
    ("learned", "none"): "无 none",
    ("alibi", "none"): "好 good",
    ("cope", "none"): "好 good",
    ("nope", "none"): "好 good",
    ("rope", "none"): "medium",
    ("rope", "ntk"): "好 good",
    ("rope", "yarn"): "很好 very good",
    ("rope", "longrope"): "极好 excellent",
}


class ExtrapolationCell(BaseModel):
    """One (encoding, method, length) result; `perplexity`, `low` and `high` are null where it cannot run, and
    `reason` says why. `method` is `none` for an encoding read as trained."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    encoding: str
    method: str
    length: int
    multiple: int
    perplexity: float | None
    low: float | None
    high: float | None
    documents: int
    reason: str | None = None


CELLS = TypeAdapter(list[ExtrapolationCell])
# after tab10's last three unused colours, so that no two rows of the figure share one (up to six extension rows;
# more, from more closed forms in the registry, start again from the first): navy, gold, black
EXTENSION_COLOURS = ("#1f3a93", "#b8860b", "#000000")


@dataclass(frozen=True)
class Row:
    encoding: str
    method: str  # "none": the encoding as trained

    @property
    def label(self) -> str:
        return self.encoding if self.method == "none" else f"{self.encoding} + {self.method}"


def evaluation_tokens(train_length: int, count: int, largest_multiple: int = MULTIPLES[-1]) -> np.ndarray:
    """[count, span + 1] byte tokens: the start of the first `count` test documents that hold span + 1 tokens."""
    from longrope.workers.reference_model import split_tokens  # torch: only when documents are read

    span = train_length * largest_multiple
    starts = [tokens[: span + 1] for tokens in split_tokens("test") if len(tokens) > span]
    if len(starts) < count:
        raise DataError(f"--documents {count}: the test split has only {len(starts)} documents of {span + 1} tokens")
    return np.stack(starts[:count])


def document_nll(model, tokens: np.ndarray, length: int, batch_tokens: int = 16384) -> np.ndarray:
    """Mean NLL per token of each document's span, read in windows of `length` predicted tokens."""
    import torch  # torch: only when scoring; the tables and plots need none
    from torch.nn import functional

    count, span = tokens.shape[0], tokens.shape[1] - 1
    windows = np.stack([tokens[:, k * length : k * length + length + 1] for k in range(span // length)], axis=1)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    rows = torch.from_numpy(windows.reshape(-1, length + 1)).to(device)
    losses = []
    with torch.inference_mode():
        for chunk in rows.split(max(1, batch_tokens // length)):
            logits = model(chunk[:, :-1])
            losses.append(functional.cross_entropy(logits.transpose(1, 2), chunk[:, 1:], reduction="none").mean(1))
    return torch.cat(losses).double().reshape(count, -1).mean(dim=1).cpu().numpy()


def measured_cell(row: Row, length: int, multiple: int, nll: np.ndarray) -> ExtrapolationCell:
    """Perplexity = exp(mean NLL per token), its interval exp() of the Student-t interval over documents."""
    mean, low, high = interval(nll)
    return ExtrapolationCell(
        encoding=row.encoding,
        method=row.method,
        length=length,
        multiple=multiple,
        perplexity=math.exp(mean),
        low=math.exp(low),
        high=math.exp(high),
        documents=len(nll),
    )


def cell_of(model, row: Row, tokens: np.ndarray, train_length: int, multiple: int) -> ExtrapolationCell:
    """Score one cell; an encoding that has no position past its table is the one reason a cell cannot run."""
    length = train_length * multiple
    try:
        return measured_cell(row, length, multiple, document_nll(model, tokens, length))
    except PositionOutOfRangeError as error:
        return ExtrapolationCell(
            encoding=row.encoding,
            method=row.method,
            length=length,
            multiple=multiple,
            perplexity=None,
            low=None,
            high=None,
            documents=len(tokens),
            reason=f"cannot run: {error}",
        )


def extension_methods(plain: RopeMethod, train_length: int, length: int, longrope: RopeMethod) -> dict:
    """{method name: RoPE method} for reading the rope model at `length`: each closed form set for that length,
    the searched factors as they are (their long factors apply past the training length)."""
    methods = baseline_methods(
        head_dim=plain.head_dim,
        rope_theta=plain.rope_theta,
        partial_rotary_factor=plain.partial_rotary_factor,
        original=train_length,
        target=length,
    )
    return {name: methods[name] for name in ROPE_EXTENSIONS if name in methods} | {"longrope": longrope}


def searched_encoding(factors: FactorsFile, config, source: str) -> RopeMethod:
    """The factors file as a LongRoPE encoding of the rope model: same pair count and original length."""
    original = factors.rope_parameters.original_max_position_embeddings
    if original != config.train_length:
        raise JobConfigError(
            f"{source}: original_max_position_embeddings is {original}, but the rope model was trained at "
            f"{config.train_length}"
        )
    theta = factors.rope_parameters.rope_theta
    if theta != config.rope_theta:
        raise JobConfigError(f"{source}: rope_theta is {theta:g}, but the rope model has {config.rope_theta:g}")
    return factors_encoding(factors, head_dim=config.head_dim, pairs=config.head_dim // 2, source=source)


def run_extrapolation(
    checkpoints: dict[str, Path],
    factors: FactorsFile,
    factors_source: str,
    *,
    documents: int,
    device: str = "cpu",
    multiples: tuple[int, ...] = MULTIPLES,
    log: Callable[[str], None] = print,
) -> list[ExtrapolationCell]:
    """Every cell: each checkpoint as trained at each multiple, then the rope checkpoint with each extension."""
    from longrope.workers.suite_training import load_suite_model  # torch: only when models are loaded

    models = {name: load_suite_model(path).to(device) for name, path in checkpoints.items()}
    train_length = _common_train_length(models)
    rope = models.get("rope")
    longrope = searched_encoding(factors, rope.config, factors_source) if rope is not None else None
    tokens = evaluation_tokens(train_length, documents, max(multiples))
    cells: list[ExtrapolationCell] = []
    for name, model in models.items():
        cells += _row_cells(model, Row(name, "none"), tokens, train_length, multiples, log)
    if rope is not None:
        plain = rope.config.plain_rope()
        for method in ROPE_EXTENSIONS:
            row_cells = []
            for multiple in multiples:
                rope.use_rope_method(extension_methods(plain, train_length, train_length * multiple, longrope)[method])
                row_cells += _row_cells(rope, Row("rope", method), tokens, train_length, (multiple,), None)
            _log_row(log, Row("rope", method), row_cells)
            cells += row_cells
        rope.use_rope_method(plain)
    return cells


def _row_cells(model, row: Row, tokens, train_length: int, multiples, log) -> list[ExtrapolationCell]:
    started = time.monotonic()
    cells = [cell_of(model, row, tokens, train_length, multiple) for multiple in multiples]
    if log is not None:
        _log_row(log, row, cells, time.monotonic() - started)
    return cells


def _log_row(log, row: Row, cells: list[ExtrapolationCell], seconds: float | None = None) -> None:
    shown = "  ".join(f"{c.multiple}x {_ppl_text(c.perplexity)}" for c in cells)
    log(f"extrapolation: {row.label:<17} {shown}" + (f"  ({seconds:.0f} s)" if seconds is not None else ""))


def _ppl_text(value: float | None) -> str:
    return "cannot run" if value is None else f"{value:.3f}"


def _common_train_length(models: dict) -> int:
    """Multiples only compare across checkpoints trained at one length."""
    lengths = {name: model.config.train_length for name, model in models.items()}
    if len(set(lengths.values())) != 1:
        raise JobConfigError(f"--checkpoints: the checkpoints were trained at different lengths ({lengths})")
    return next(iter(lengths.values()))


def rows_of(cells: list[ExtrapolationCell]) -> list[Row]:
    """The rows in the order they were run (the table's and the plot's order)."""
    return list(dict.fromkeys(Row(cell.encoding, cell.method) for cell in cells))


def markdown_table(cells: list[ExtrapolationCell]) -> str:
    """Rows in run order; a column per multiple (perplexity [95% interval]); the best of each column in bold;
    the guide's word beside each row it rates; and how much perplexity grows from 1x to the longest length."""
    multiples = sorted({cell.multiple for cell in cells})
    by_key = {(cell.encoding, cell.method, cell.multiple): cell for cell in cells}
    best = {m: min((c.perplexity for c in cells if c.multiple == m and c.perplexity), default=None) for m in multiples}
    train_length = cells[0].length // cells[0].multiple
    header = ["encoding (+ method)", "guide", *[f"{m}x ({m * train_length})" for m in multiples]]
    header.append(f"{multiples[-1]}x / 1x")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows_of(cells):
        row_cells = [by_key[(row.encoding, row.method, m)] for m in multiples]
        texts = [_cell_text(cell, best[cell.multiple]) for cell in row_cells]
        first, last = row_cells[0].perplexity, row_cells[-1].perplexity
        growth = f"{last / first:.2f}x" if first and last else "—"
        lines.append(
            f"| {row.label} | {GUIDE_WORDS.get((row.encoding, row.method), '—')} | {' | '.join(texts)} | {growth} |"
        )
    documents = cells[0].documents
    lines += [
        "",
        f"Test perplexity (lower is better) with its 95% interval over {documents} held-out documents; every column"
        f" predicts the same {multiples[-1] * train_length} tokens per document, in windows of the column's length."
        " Closed-form methods are set for the length they are read at; longrope uses its searched factors as given.",
    ]
    return "\n".join(lines) + "\n"


def _cell_text(cell: ExtrapolationCell, best: float | None) -> str:
    if cell.perplexity is None:
        return "cannot run"
    value = f"{cell.perplexity:.3f}"
    if best is not None and value == f"{best:.3f}":  # ties as printed are all bold
        value = f"**{value}**"
    return f"{value} [{cell.low:.3f}, {cell.high:.3f}]"


def plot_extrapolation(cells: list[ExtrapolationCell], path: Path | None = None):
    """Perplexity against length, both axes log, one line per row with 95% intervals as error bars, in two panels
    that share the y axis: the encodings as trained (left) and the RoPE model with each extension method (right,
    plain RoPE repeated as the reference). A row that cannot run past its table stops where it stops."""
    from matplotlib import colormaps  # matplotlib: only when drawing
    from matplotlib.figure import Figure  # matplotlib: only when drawing

    fig = Figure(figsize=(12, 5.5))
    left, right = fig.subplots(1, 2, sharey=True)
    rows = rows_of(cells)
    trained = [row for row in rows if row.method == "none"]
    extended = [row for row in rows if row.encoding == "rope"]
    palette = [colormaps["tab10"](k) for k in range(10) if k != 7]  # grey is the grid's colour
    colours = {row: palette[k % len(palette)] for k, row in enumerate(trained)}
    others = itertools.cycle(palette[len(trained) :] + list(EXTENSION_COLOURS))
    colours |= {row: next(others) for row in extended if row not in colours}
    for ax, panel, title in (
        (left, trained, "the encodings as trained"),
        (right, extended, "the RoPE model read with each extension"),
    ):
        for index, row in enumerate(panel):
            _plot_row(ax, cells, row, colours[row], nudge=0.015 * (index - (len(panel) - 1) / 2))
        _length_axes(ax, cells)
        ax.set_title(title)
        ax.legend(fontsize=8)
    left.set_ylabel("test perplexity (log scale, lower is better)")
    fig.suptitle("Extrapolation of the suite's positional encodings (one architecture, corpus and training budget)")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def _plot_row(ax, cells: list[ExtrapolationCell], row: Row, colour, *, nudge: float) -> None:
    """One row's line with error bars, nudged along x so that rows' bars do not hide each other."""
    mine = [c for c in cells if (c.encoding, c.method) == (row.encoding, row.method)]
    points = [c for c in mine if c.perplexity is not None]
    if not points:
        return
    label = row.label + (f" (cannot run past {points[-1].length})" if len(points) < len(mine) else "")
    ax.errorbar(
        np.array([c.length for c in points], dtype=float) * (1 + nudge),
        [c.perplexity for c in points],
        yerr=np.array([[c.perplexity - c.low for c in points], [c.high - c.perplexity for c in points]]),
        label=label,
        color=colour,
        linestyle="--" if row.method != "none" else "-",
        marker="o",
        markersize=4,
        capsize=2,
    )


def _length_axes(ax, cells: list[ExtrapolationCell]) -> None:
    """Log x at the measured lengths, log y labelled with plain numbers, covering every interval."""
    from matplotlib.ticker import NullLocator  # matplotlib: only when drawing

    lengths = sorted({c.length for c in cells})
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.xaxis.set_minor_locator(NullLocator())
    bottom = min(c.low for c in cells if c.low is not None) / 1.05
    top = max(c.high for c in cells if c.high is not None) * 1.05
    ax.set_ylim(bottom, top)
    log_axis(ax.yaxis, bottom, top)
    ax.set_xlabel(f"context length (tokens); trained at {lengths[0]}")
    ax.grid(True, which="major", alpha=0.3)


def write_outputs(cells: list[ExtrapolationCell], directory: Path) -> None:
    """extrapolation.json and .md (each atomically), and the plot, into `directory`."""
    write_text_atomic(directory / "extrapolation.json", CELLS.dump_json(cells, indent=1).decode() + "\n")
    write_text_atomic(directory / "extrapolation.md", markdown_table(cells))
    plot_extrapolation(cells, directory / "extrapolation.png")
