"""`longrope status RUN... --plot` (docs/search-cost.md, "Watching a long search"): the best search perplexity
against the window-equivalents spent, every run on one axis, as a PNG.

The cost trajectory is checked against one worked by hand from a tiny history (a racing candidate's partial
line, a stopped one, a gradient step's backward windows, a tie); the figure's lines against it; the CLI's PNG
is read back (its size, and the lines' colours in it), its lines against the runs' histories worked out here;
and bad input is one error line that writes nothing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from cli_checks import cli_error_line
from matplotlib.image import imread
from search_helpers import FunctionEvaluator, make_coordinator, problem, write_job_record

from longrope.search.cli.estimate_command import job_backward_cost
from longrope.search.cli.main import main
from longrope.search.optimizers.factory import load_job_config
from longrope.search.reports import progress_plot
from longrope.search.run.run_store import RunDir
from longrope.search.run.stages import stage_configs
from longrope.search.run.trajectory import cost_trajectory

WINDOWS = 4
FACTORS = [1.0] * 16


def line(key: str, nll: list[float], status: str = "scored", **extra) -> dict:
    """A history line of the cheap problem's shape (one token per window: the mean NLL is the windows' mean)."""
    mean = sum(nll) / len(nll) if status == "scored" else None
    return {
        "key": key,
        "status": status,
        "generation": 0,
        "seed": None,
        "factors": FACTORS,
        "n_hat": 0,
        "attention_factor": 1.0,
        "mean_nll": mean,
        "perplexity": None if mean is None else math.exp(mean),
        "nll": nll,
        "tokens": [1] * len(nll),
        **extra,
    }


# a: scored on 2 windows; b: raced, a partial line then its final one (1 new window); c: stopped by racing after
# 1 window; d: a gradient step (2 windows, 1 of them with a backward pass); e: ties d's mean NLL (d keeps the
# best: ties go to the smaller key)
TINY = [
    line("a", [1.0, 1.2]),
    line("b", [0.5], "partial"),
    line("b", [0.5, 0.7]),
    line("c", [2.0], "stopped"),
    line("d", [0.4, 0.6], gradient_windows=[0, 1], backward_windows=1, gradient=[0.0] * 17),
    line("e", [0.3, 0.7]),
]
C = 2.0
# (forward, backward, window-equivalents = forward + 2 x backward, best key, evaluations) after each line
BY_HAND = [
    (2, 0, 2.0, "a", 1),
    (3, 0, 3.0, "a", 1),
    (4, 0, 4.0, "b", 2),
    (5, 0, 5.0, "b", 3),
    (7, 1, 9.0, "d", 4),
    (9, 1, 11.0, "d", 5),
]
MEANS = {"a": 1.1, "b": 0.6, "d": 0.5}


def tiny_run(folder: Path, *, torn: bool = False) -> Path:
    """A run directory holding config.json and the tiny history (a torn last line after it, when asked)."""
    config = load_job_config(None, ["target_length=256", f"output_dir={folder}", "name=tiny"])
    RunDir(folder).create(config)
    text = "".join(json.dumps(record) + "\n" for record in TINY)
    (folder / "history.jsonl").write_text(text + ('{"key": "f", "sta' if torn else ""))
    return folder


def test_the_cost_trajectory_is_the_one_worked_by_hand(tmp_path):
    points = cost_trajectory(tiny_run(tmp_path / "run", torn=True), C)
    got = [(p.forward, p.backward, p.cost, p.best.key, p.evaluations) for p in points]
    assert got == BY_HAND, "the torn last line (a write in progress) is left out"
    assert [p.best_nll for p in points] == pytest.approx([MEANS[key] for *_, key, _ in BY_HAND])


def test_the_figure_draws_the_trajectory_and_names_c(tmp_path):
    """The figure's line is the hand-worked trajectory: x the window-equivalents, y the best perplexity so far,
    as steps; the x axis names c, the legend the run's name, optimizer and directory."""
    run = progress_plot.plotted_run(str(tiny_run(tmp_path / "run")))
    assert run.backward_windows == 1 and run.label == f"tiny (dim_mono), {tmp_path / 'run'}, 256 tokens"
    line = progress_plot.progress_line(run, C)
    fig = progress_plot.plot_progress([line], "window-equivalents, c = 2.00", tmp_path / "p.png")
    ax = fig.axes[0]
    drawn = ax.get_lines()[0]
    assert drawn.get_drawstyle() == "steps-post" and drawn.get_label() == run.label
    assert np.allclose(drawn.get_xdata(), [cost for _, _, cost, _, _ in BY_HAND])
    assert np.allclose(drawn.get_ydata(), [math.exp(MEANS[key]) for *_, key, _ in BY_HAND])
    assert ax.get_xlabel() == "window-equivalents, c = 2.00" and ax.get_yscale() == "log"
    assert [text.get_text() for text in ax.get_legend().get_texts()] == [run.label]
    assert read_png(tmp_path / "p.png").shape == (600, 1080, 4)


def read_png(path: Path) -> np.ndarray:
    return imread(path)


# ---- the command line on real runs of the cheap objective ----


def search_run(folder: Path, *overrides: str) -> Path:
    """A finished run of the cheap problem on 4 windows, with job.json as `longrope search` writes it."""
    settings = ["target_length=256", f"data.search_windows={WINDOWS}", "search.seed=3", f"output_dir={folder}"]
    config = load_job_config(None, [*settings, *overrides])
    RunDir(folder).create(config)
    write_job_record(folder, config, search_windows={"count": WINDOWS, "tokens": 257})
    make_coordinator(config, RunDir(folder), FunctionEvaluator(windows=WINDOWS, wobble=0.0), problem(WINDOWS)).run()
    return folder


GA = ["search.population=16", "search.parents=8", "search.mutations=4", "search.crossovers=4", "search.generations=3"]
GRADIENT = ["search.optimizer=gradient", "search.gradient.steps=6"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("runs")
    return search_run(root / "ga", *GA), search_run(root / "gd", *GRADIENT)


def by_hand(run: Path, c: float) -> tuple[list[float], list[float]]:
    """(window-equivalents, best perplexity so far) after each history line, for a run without racing (one line
    per candidate, each on every window): from the first line on, since every line is scored."""
    cost, best, xs, ys = 0.0, math.inf, [], []
    for record in map(json.loads, (run / "history.jsonl").read_text().splitlines()):
        cost += len(record["nll"]) + c * record.get("backward_windows", 0)
        best = min(best, record["perplexity"])
        xs.append(cost)
        ys.append(best)
    return xs, ys


@pytest.fixture
def drawn(monkeypatch) -> list:
    """The figures `status --plot` draws, kept as it returns them."""
    figures = []
    plot = progress_plot.plot_progress

    def keep(*args, **kwargs):
        figures.append(plot(*args, **kwargs))
        return figures[-1]

    monkeypatch.setattr(progress_plot, "plot_progress", keep)
    return figures


def test_status_plot_draws_every_run_on_one_axis(runs, tmp_path, capsys, drawn):
    ga, gd = runs
    png = tmp_path / "both.png"
    assert main(["status", str(ga), str(gd), "--plot", str(png), "--backward-cost", "2.82"]) == 0
    out, err = capsys.readouterr()
    assert out.count("\nrun ") == 1 and f"in {ga}" in out and f"in {gd}" in out, "both runs summarised"
    assert err.strip() == f"status: wrote {png}"
    ax = drawn[0].axes[0]
    ga_line, gd_line = (line for line in ax.get_lines() if not line.get_label().startswith("_"))
    assert ga_line.get_label() == f"longrope-search (dim_mono), {ga}, 256 tokens"
    assert gd_line.get_label() == f"longrope-search (gradient), {gd}, 256 tokens"
    assert ax.get_title() == "search progress: best candidate against cost", "one length: no warning"
    for line, run in ((ga_line, ga), (gd_line, gd)):
        xs, ys = by_hand(run, 2.82)
        assert np.allclose(line.get_xdata(), xs) and np.allclose(line.get_ydata(), ys)
    assert ga_line.get_xdata()[-1] == (16 + 3 * 8) * WINDOWS, "the GA: every candidate on every window, forward"
    assert "c = 2.82 (--backward-cost)" in ax.get_xlabel()
    image = read_png(png)
    assert image.shape == (600, 1080, 4)
    for colour in (ga_line.get_color(), gd_line.get_color()):  # each line is in the picture, in its colour
        rgb = np.array([int(colour[k : k + 2], 16) / 255 for k in (1, 3, 5)])
        assert (np.abs(image[..., :3] - rgb).max(axis=-1) < 0.02).sum() > 100


def test_status_plot_defaults_to_the_run_s_progress_png_and_estimate_s_c(runs, capsys, drawn):
    """--plot alone writes RUN/progress.png (the first RUN's), and a backward pass costs what `longrope
    estimate` prices it at for the run's model: the x axis says which c."""
    _, gd = runs
    assert main(["status", str(gd), "--plot"]) == 0
    assert capsys.readouterr().err.strip() == f"status: wrote {gd / 'progress.png'}"
    assert read_png(gd / "progress.png").shape == (600, 1080, 4)
    c, model = job_backward_cost(RunDir(gd).read_config())
    assert 1.5 < c < 3.6
    ax = drawn[0].axes[0]
    assert f"c = {c:.2f} (longrope estimate's FLOPs ratio for {model})" in ax.get_xlabel()
    assert np.allclose(ax.get_lines()[0].get_xdata(), by_hand(gd, c)[0])
    (gd / "progress.png").unlink()


def test_a_forward_only_plot_needs_no_c(runs, tmp_path, capsys, drawn):
    ga, _ = runs
    assert main(["status", str(ga), "--plot", str(tmp_path / "ga.png")]) == 0
    assert "no backward pass in these runs" in drawn[0].axes[0].get_xlabel()


def test_a_progressive_job_draws_its_latest_started_stage(tmp_path):
    """A job of stages is drawn as `status` reports it: its latest started stage, named in its line."""
    config = load_job_config(
        None, ["target_length=256", "data.search_windows=1", "search.stages=[128]", f"output_dir={tmp_path}", *GA]
    )
    RunDir(tmp_path).create(config)
    for stage in stage_configs(config, tmp_path):
        RunDir(stage.output_dir).create(stage)
        make_coordinator(stage, RunDir(stage.output_dir), FunctionEvaluator()).run()
    run = progress_plot.plotted_run(str(tmp_path))
    assert run.run_dir.path == tmp_path / "stage-2-256"
    assert run.label == f"longrope-search (dim_mono), {tmp_path}, 256 tokens, stage 2/2"
    assert [p.cost for p in run.points] == [p.cost for p in cost_trajectory(tmp_path / "stage-2-256", 0.0)]


# ---- bad input: one line, exit 2, nothing written ----


def test_status_plot_bad_input_is_one_line(runs, tmp_path, capsys, caplog):
    ga, _ = runs
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text((ga / "config.json").read_text())
    (tmp_path / "file").write_text("x")
    cases = [
        (["status", str(tmp_path / "missing"), "--plot"], f"{tmp_path / 'missing'}: no such directory"),
        (["status", str(empty), "--plot"], f"{empty}: no scored candidate yet"),
        (["status", str(ga), "--plot", str(tmp_path)], f"--plot {str(tmp_path)!r}: is a directory; give a file name"),
        (["status", str(ga), "--plot", str(tmp_path / "file" / "p.png")], f"{str(tmp_path / 'file')!r} is not a dir"),
        (["status", str(ga), "--plot", "--backward-cost", "-1"], "--backward-cost: must be a number from 0 to"),
        (["status", str(ga), "--plot", "--backward-cost", "many"], "got 'many'"),
        (["status", str(ga), "--backward-cost", "2"], "--backward-cost: it prices the window-equivalents --plot"),
    ]
    for argv, expected in cases:
        assert expected in cli_error_line(argv, capsys, caplog, folder=tmp_path), argv
    assert not (ga / "progress.png").exists()
