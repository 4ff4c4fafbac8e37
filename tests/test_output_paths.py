"""Where `export -o`, `export --into` and `status --plot` may write: never over a file of a run directory, by any
path that resolves to one; one set of rules for an output path, the same for both commands; a plot in the format its
name says; the runs drawn named with their length, each once; a log axis whose labelled ticks enclose every value
drawn.

Every refusal is checked by `cli_error_line`: exit 2, one error line, and the whole folder (the runs in it too)
byte-identical afterwards.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from cli_checks import cli_error_line
from search_helpers import known_problem_run

from longrope.search.cli.main import main
from longrope.search.reports import progress_plot
from longrope.search.reports.plot_axes import enclosing_log_ticks

RUN_FILES = ("config.json", "job.json", "history.jsonl", "state.json", "heartbeat.json")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished run of the cheap objective, with a heartbeat.json as a stopped `longrope search` leaves it."""
    folder = known_problem_run(tmp_path_factory.mktemp("runs") / "run")
    (folder / "heartbeat.json").write_text('{"pid": 1}')
    return folder


def writers(run: Path, target: Path) -> list[list[str]]:
    """The commands that write a file the user names, each told to write `target`."""
    return [
        ["export", str(run), "-o", str(target)],
        ["status", str(run), "--plot", str(target)],
    ]


@pytest.mark.parametrize("name", RUN_FILES)
def test_no_command_writes_over_a_file_of_a_run_directory(run, name, tmp_path, capsys, caplog):
    """`status RUN --plot RUN/history.jsonl` and `export RUN -o RUN/config.json` would replace the run's record:
    named directly, through `..`, or through a symlink, it is refused and the run is left as it was."""
    link = tmp_path / "innocent.png"
    link.symlink_to(run / name)
    for target in (run / name, run / ".." / run.name / name, link):
        for argv in writers(run, target):
            line = cli_error_line(argv, capsys, caplog, folder=run.parent)
            assert f"'{run / name}' is the {name} of the run directory '{run}'" in line, argv


def test_a_run_directory_of_another_run_is_protected_too(run, tmp_path, capsys, caplog):
    """The rule is about any run directory, not the one the command reads: another run's history, and a folder
    that holds a run's files without its config.json (a stage that lost it, a run being copied)."""
    other = known_problem_run(tmp_path / "other")
    line = cli_error_line(["export", str(run), "-o", str(other / "history.jsonl")], capsys, caplog, folder=tmp_path)
    assert "is the history.jsonl of the run directory" in line
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "history.jsonl").write_text("")
    line = cli_error_line(["status", str(run), "--plot", str(partial / "config.json")], capsys, caplog, folder=tmp_path)
    assert f"is the config.json of the run directory '{partial}'" in line


def test_commands_that_fill_a_folder_refuse_a_run_directory(run, capsys, caplog):
    """`export --into DIR` writes DIR/config.json, and `train-reference --out DIR` a model there: a run
    directory given as DIR keeps its config.json."""
    for argv in (["export", str(run), "--into", str(run)], ["train-reference", "--out", str(run), "--steps", "1"]):
        line = cli_error_line(argv, capsys, caplog, folder=run.parent)
        assert f"'{run}' is a search's run directory, whose files are the run's record" in line, argv


def test_a_run_s_own_other_files_may_be_written(run, tmp_path, capsys):
    """What is no record of the run may go into its folder: the demo exports RUN/factors.json, and --plot's
    default is RUN/progress.png. A model directory's config.json is no run's."""
    assert main(["export", str(run), "-o", str(run / "factors.json")]) == 0
    assert main(["status", str(run), "--plot"]) == 0
    assert (run / "factors.json").read_text().startswith("{") and (run / "progress.png").read_bytes()[:4] == b"\x89PNG"
    (run / "factors.json").unlink()
    (run / "progress.png").unlink()
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    assert main(["export", str(run), "-o", str(model / "config.json")]) == 0


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda p: os.mkfifo(p), "a FIFO, not a regular file; give a file name"),
        (lambda p: p.mkdir(), "is a directory; give a file name"),
        (lambda p: p.symlink_to(p), "a symlink loop; give a file name"),
        (lambda p: None, "the folder"),  # a missing folder: `make` leaves p's parent missing below
    ],
    ids=["fifo", "directory", "symlink-loop", "missing-folder"],
)
def test_one_rule_for_every_output_path(run, tmp_path, make, expected, capsys, caplog):
    """A FIFO, a folder, a symlink loop or a missing folder as the output path: --plot and export give the same
    answer for each path (one helper), and make no folder."""
    target = tmp_path / ("missing" if expected == "the folder" else "") / "out.png"
    make(target)
    answers = [
        cli_error_line(argv, capsys, caplog, folder=tmp_path).split(": ", 3)[-1] for argv in writers(run, target)
    ]
    assert all(expected in answer for answer in answers), answers
    assert answers[0] == answers[1], "the same rule, the same words"
    if expected == "the folder":
        assert not (tmp_path / "missing").exists()


def test_a_dangling_symlink_is_written_through_by_both(run, tmp_path):
    """A dangling link as the output path: --plot, like export, creates the link's target and leaves the link."""
    for argv_of, name in (
        (lambda t: ["export", str(run), "-o", str(t)], "f.json"),
        (lambda t: ["status", str(run), "--plot", str(t)], "p.png"),
    ):
        link, target = tmp_path / f"link-{name}", tmp_path / name
        link.symlink_to(target)
        assert main(argv_of(link)) == 0
        assert link.is_symlink() and os.readlink(link) == str(target) and target.stat().st_size > 0


@pytest.mark.parametrize(
    "name, magic",
    [("p.pdf", b"%PDF"), ("p.jpg", b"\xff\xd8\xff"), ("p.svg", b"<?xml"), ("p.PNG", b"\x89PNG"), ("p", b"\x89PNG")],
)
def test_the_plot_is_written_in_the_format_its_name_says(run, tmp_path, name, magic):
    """`--plot x.pdf` writes a PDF, `x.jpg` a JPEG, and so on. No extension: PNG."""
    assert main(["status", str(run), "--plot", str(tmp_path / name)]) == 0
    assert (tmp_path / name).read_bytes().startswith(magic)


def test_a_plot_name_matplotlib_cannot_write_is_refused(run, tmp_path, capsys, caplog):
    line = cli_error_line(["status", str(run), "--plot", str(tmp_path / "p.txt")], capsys, caplog, folder=tmp_path)
    assert "matplotlib writes no .txt files; name it" in line and ".pdf" in line


def test_a_run_given_twice_is_refused(run, capsys, caplog):
    """`status R R --plot` is refused rather than drawing the same run twice, as compare refuses a file given
    twice."""
    for argv in (["status", str(run), str(run), "--plot"], ["status", str(run), str(run / ".." / run.name)]):
        line = cli_error_line(argv, capsys, caplog, folder=run.parent)
        assert "give each run directory once" in line, argv


@pytest.mark.parametrize("value", ["1e308", "101", "nan", "-0.5"])
def test_backward_cost_out_of_any_real_range_is_refused(run, value, capsys, caplog):
    """--backward-cost outside 0-100 is refused: 1e308 would push the gradient steps off the plot and make the x
    label a 300-digit number."""
    line = cli_error_line(["status", str(run), "--plot", "--backward-cost", value], capsys, caplog, folder=run.parent)
    assert f"--backward-cost: must be a number from 0 to 100, got '{value}'" in line


def test_runs_of_different_lengths_say_so(tmp_path, capsys, monkeypatch):
    """Runs of 256 and 512 tokens drawn on one axis: each line names its length, and the title says the lines are
    not comparable."""
    short = known_problem_run(tmp_path / "short", "target_length=256")
    long = known_problem_run(
        tmp_path / "long", "target_length=512", target_length=512, search_windows={"count": 1, "tokens": 513}
    )
    figures = []
    plot = progress_plot.plot_progress
    monkeypatch.setattr(progress_plot, "plot_progress", lambda *a, **k: figures.append(plot(*a, **k)) or figures[-1])
    assert main(["status", str(short), str(long), "--plot", str(tmp_path / "p.png")]) == 0
    ax = figures[0].axes[0]
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert labels[0].endswith(f"{short}, 256 tokens") and labels[1].endswith(f"{long}, 512 tokens")
    assert "not comparable across lines: the runs search different target lengths (256, 512 tokens)" in ax.get_title()


@pytest.mark.parametrize("low, high", [(3.2, 27.7), (3.2, 3.7), (3.61, 3.65), (1.05, 1.2), (5.0, 5.0), (2.0, 4e5)])
def test_the_y_ticks_enclose_every_value(low, high):
    """The ticks start at or below the lowest value and end at or above the highest (with a 1% margin), so the
    demo's final values 3.2-3.7 get a labelled tick below 4 and the axis does not end at the data; they are of one
    1-2-5-like series, and few enough to read."""
    ticks = enclosing_log_ticks(low, high)
    assert ticks[0] <= low / 1.01 and ticks[-1] >= high * 1.01
    assert 2 <= len(ticks) <= 10 and ticks == sorted(set(ticks))
    # no labelled tick is wasted far outside the data: the first and last are the nearest of their series
    assert ticks[1] > low / 1.01 and ticks[-2] < high * 1.01


def test_the_demo_like_plot_labels_both_ends(tmp_path):
    """The figure's y axis: from a tick at or below the lowest best perplexity to one at or above the highest
    (the PI seed's 27.7 on the demo), every value drawn between them."""
    lines = [progress_plot.ProgressLine("run", (1.0, 2.0, 3.0), (27.7, 4.1, 3.2))]
    ax = progress_plot.plot_progress(lines, "cost").axes[0]
    bottom, top = ax.get_ylim()
    ticks = list(ax.yaxis.get_majorticklocs())
    assert bottom == ticks[0] <= 3.2 and top == ticks[-1] >= 27.7
    assert [ax.yaxis.get_major_formatter()(t, 0) for t in (ticks[0], ticks[-1])] == ["3", "30"]
    assert all(bottom <= y <= top for y in lines[0].perplexity)
    assert math.isclose(ticks[1], 4.0)
