"""What `longrope compare` hands a user: one row per factors file under a label that tells them apart, a results
directory of its own per run, and plots and a table that can be read without the code.

Plot and table tests draw a synthetic compare.json-shaped result (no model). CLI tests run `longrope compare` in
process on the demo config with the worker pool replaced by a deterministic fake (`FakePool`), so they cost the
window cutting only; bad input must be refused before the pool is ever built (`RefusingPool`)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from cli_checks import longrope_block, snapshot, write_factors_file
from compare_fakes import FakePool
from matplotlib.colors import to_hex
from matplotlib.container import ErrorbarContainer

from longrope.search.cli.main import main
from longrope.search.reports import compare
from longrope.search.reports.compare_plots import plot_factors, plot_paired_difference, plot_perplexity
from longrope.search.reports.compare_result import BASELINES
from longrope.search.reports.compare_rows import factors_rows
from longrope.search.reports.compare_tables import describe_windows, markdown_table
from longrope.search.reports.needle_report import plot_needle_heatmap

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
LENGTHS = [128, 256, 512, 1024]
WINDOWS = 24
# (ppl at each length, attention factor): PI sits far above the 3-6 band where the other methods differ
PERPLEXITY = {
    "none": ([3.594, 5.547, 11.935, 18.114], 1.0),
    "pi": ([30.426, 34.764, 32.431, 31.675], 1.0),
    "ntk": ([3.999, 4.397, 5.265, 10.769], 1.0),
    "dynamic": ([3.594, 4.428, 5.097, 6.179], 1.0),
    "yarn": ([4.461, 4.992, 5.268, 4.806], 1.2079441541679836),
    "llama3": ([4.464, 5.660, 6.547, 6.649], 1.0),
    "ntk_tuned": ([3.725, 4.784, 4.926, 5.277], 1.2),
    "file:factors.json": ([3.735, 4.382, 4.500, 4.127], 1.21),
    "ntk_tuned (vLLM)": ([4.400, 4.781, 4.920, 5.279], 1.2),
    "file:factors.json (vLLM)": ([3.980, 4.382, 4.500, 4.127], 1.21),
}
DIFFERENCE = {"yarn": 0.0, "file:factors.json": -0.1523, "file:factors.json (vLLM)": -0.1523, "pi": 1.8856}


def synthetic_result() -> dict:
    """A result shaped like compare.json after a JSON round trip (string length keys), from the demo's numbers."""
    methods = {}
    for k, (name, (ppl, attention)) in enumerate(PERPLEXITY.items()):
        factors = np.minimum(8.0, np.geomspace(1.0, 8.0 + k, 16)).tolist()
        cell = {"accuracy": [0.5, 0.3, 0.7], "answer_nll": [1.0, 0.9, 1.1], "windows": WINDOWS}
        cell["accuracy_by_depth"] = {f"{edge:g}": [edge, 0.0, 1.0] for edge in (0.0, 0.25, 0.5, 0.75, 1.0)}
        methods[name] = {
            "runtime": "vllm" if name.endswith("(vLLM)") else "transformers",
            "perplexity": {str(n): [p, p / 1.15, p * 1.15] for n, p in zip(LENGTHS, ppl, strict=True)},
            "factors": factors,
            "attention_factor": attention,
            "nll_per_window": {str(n): [math.log(p)] * WINDOWS for n, p in zip(LENGTHS, ppl, strict=True)},
            "paired_difference_to_best_baseline": [(d := DIFFERENCE.get(name, 0.3)), d - 0.01, d + 0.01],
            "needle": {str(n): cell for n in LENGTHS},
        }
    return {
        "target_length": 1024,
        "original_length": 128,
        "lengths": LENGTHS,
        "rope": {"rope_theta": 10000.0, "pairs": 16},
        "windows": {str(n): WINDOWS for n in LENGTHS},
        "best_baseline": "yarn",
        "ntk_tuned": {"ntk_factor": 32.0, "attention_factor": 1.2},
        "methods": methods,
    }


def error_bar_lines(ax) -> dict[str, ErrorbarContainer]:
    return {c.lines[0].get_gid(): c for c in ax.containers if isinstance(c, ErrorbarContainer)}


def tick_texts(labels) -> list[str]:
    return [label.get_text() for label in labels if label.get_text()]


# --- plots -----------------------------------------------------------------------------------------------------


def test_perplexity_plot_has_plain_log_ticks_error_bars_and_marked_lengths(tmp_path):
    result = synthetic_result()
    fig = plot_perplexity(result, tmp_path / "p.png")
    (ax,) = fig.axes
    assert (tmp_path / "p.png").stat().st_size > 0, "the figure is saved as well as returned"
    assert ax.get_xlabel().startswith("context length") and "perplexity" in ax.get_ylabel()
    assert "lower is better" in ax.get_ylabel()
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    assert tick_texts(ax.get_xticklabels()) == ["128\n(original)", "256", "512", "1024\n(target)"]
    assert tick_texts(ax.get_xticklabels(minor=True)) == [], "no 2x10^2-style minor labels"
    y_ticks = tick_texts(ax.get_yticklabels())
    assert len(y_ticks) >= 4 and all(re.fullmatch(r"\d+(\.\d+)?", text) for text in y_ticks), y_ticks
    assert tick_texts(ax.get_yticklabels(minor=True)) == []
    lines = {line.get_gid(): line for line in ax.get_lines()}
    assert lines["original_length"].get_xdata()[0] == 128 and lines["target_length"].get_xdata()[0] == 1024
    bars = error_bar_lines(ax)
    assert set(bars) == set(result["methods"])
    for name in ("yarn", "file:factors.json", "ntk_tuned (vLLM)"):
        assert bars[name].has_yerr
        (segments,) = [col.get_segments() for col in bars[name].lines[2]]
        low, high = result["methods"][name]["perplexity"]["1024"][1:]
        assert len(segments) == len(LENGTHS)
        assert segments[-1][0][1] == pytest.approx(low) and segments[-1][1][1] == pytest.approx(high)


def test_pi_does_not_squash_the_band_where_methods_differ():
    """PI (~30) is off the y range, drawn as labelled markers on the top edge; the 3-6 band keeps most of the
    height (with PI on scale it would get about a quarter)."""
    fig = plot_perplexity(synthetic_result())
    (ax,) = fig.axes
    bottom, top = ax.get_ylim()
    assert bottom <= 3.6 * 0.87 and 6.0 < top < 30.0
    assert math.log(6 / 3.1) / math.log(top / bottom) > 0.4
    notes = {text.get_gid(): text.get_text() for text in ax.texts if text.get_gid()}
    for n, value in zip(LENGTHS, PERPLEXITY["pi"][0], strict=True):
        assert notes[f"off-scale:pi@{n}"] == f"pi {value:.1f}"
    pi_points = error_bar_lines(ax)["pi"].lines[0].get_ydata()
    assert np.isnan(np.asarray(pi_points, dtype=float)).all(), "off-scale points are not drawn inside the axes"


def test_a_method_has_one_colour_in_every_plot_and_its_vllm_twin_is_dashed():
    result = synthetic_result()
    bars = error_bar_lines(plot_perplexity(result).axes[0])
    perplexity_colours = {name: to_hex(c.lines[0].get_color()) for name, c in bars.items()}
    bases = [name for name in result["methods"] if not name.endswith("(vLLM)")]
    assert len({perplexity_colours[name] for name in bases}) == len(bases), "one colour per method"
    for twin in ("ntk_tuned", "file:factors.json"):
        assert perplexity_colours[f"{twin} (vLLM)"] == perplexity_colours[twin]
        assert bars[f"{twin} (vLLM)"].lines[0].get_linestyle() == "--" and bars[twin].lines[0].get_linestyle() == "-"
    factor_lines = [line for line in plot_factors(result).axes[0].get_lines() if line.get_gid() in result["methods"]]
    drawn = {"pi", "ntk", "yarn", "llama3", "ntk_tuned", "file:factors.json"}  # no none, dynamic or (vLLM) twin
    assert {line.get_gid() for line in factor_lines} == drawn
    for line in factor_lines:
        assert to_hex(line.get_color()) == perplexity_colours[line.get_gid()], line.get_gid()
    panels = [ax for ax in plot_needle_heatmap(result).axes if ax.get_title()]
    for ax in panels:
        assert to_hex(ax.title.get_color()) == perplexity_colours[ax.get_title()], ax.get_title()


def test_factors_plot_names_the_attention_factor_and_uses_plain_log_ticks():
    ax = plot_factors(synthetic_result()).axes[0]
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert "yarn (attn 1.208)" in legend and "file:factors.json (attn 1.210)" in legend and "pi (attn 1.000)" in legend
    assert ax.get_yscale() == "log" and "factor" in ax.get_ylabel() and "pair" in ax.get_xlabel()
    y_ticks = tick_texts(ax.get_yticklabels())
    assert "1" in y_ticks and all(re.fullmatch(r"\d+(\.\d+)?", text) for text in y_ticks), y_ticks
    wavelengths = {line.get_gid(): line.get_xdata()[0] for line in ax.get_lines() if line.get_gid()}
    # pair i has wavelength 2 pi 10000^(i/16): 128 tokens at i = 5.24, 1024 at i = 8.85
    assert wavelengths["original_length"] == pytest.approx(16 * math.log(128 / (2 * math.pi)) / math.log(1e4))
    assert wavelengths["target_length"] == pytest.approx(16 * math.log(1024 / (2 * math.pi)) / math.log(1e4))


def test_paired_difference_plot_draws_each_rows_interval_and_marks_the_far_ones():
    """Each row at its mean paired difference with its interval as the bar (file:factors.json at -0.1523, bars to
    -0.1623 and -0.1423); PI's +1.8856 lies past the 0.5 span, so it is a triangle on the right edge with its value
    written; the top axis reads exp(difference) (0.1 nats: a ratio of 1.105)."""
    result = synthetic_result()
    fig = plot_paired_difference(result)
    ax = fig.axes[0]
    bars = error_bar_lines(ax)
    assert set(bars) == set(result["methods"]) - {"pi"}  # the others at +0.3 or less: within the span, drawn
    (segment,) = bars["file:factors.json"].lines[2][0].get_segments()
    assert bars["file:factors.json"].lines[0].get_xdata()[0] == pytest.approx(-0.1523)
    assert sorted(x for x, _ in segment) == pytest.approx([-0.1623, -0.1423])
    (marker,) = [line for line in ax.get_lines() if line.get_gid() == "pi"]
    assert marker.get_xdata()[0] == pytest.approx(ax.get_xlim()[1]) and ax.get_xlim()[1] <= 0.5
    assert "+1.886" in [text.get_text() for text in ax.texts]
    assert tick_texts(ax.get_yticklabels()) == list(result["methods"])
    top = next(child for child in ax.get_children() if type(child).__name__ == "SecondaryAxis")
    assert top._functions[0](0.1) == pytest.approx(math.exp(0.1))


def test_needle_heatmap_names_the_original_and_target_columns():
    fig = plot_needle_heatmap(synthetic_result())
    panel = fig.axes[0]
    assert tick_texts(panel.get_xticklabels()) == ["128\n(original)", "256", "512", "1024\n(target)"]
    assert {text.get_text() for text in panel.texts} == {"0.00", "0.25", "0.50", "0.75", "1.00"}


def test_markdown_says_units_direction_and_window_count_and_bolds_the_best():
    text = markdown_table(synthetic_result())
    assert "Lower is better" in text and f"{WINDOWS} windows at every length" in text
    assert "exp(mean NLL per token" in text and "nats/token" in text
    table = [line.strip("| ").split(" | ") for line in text.splitlines() if line.startswith("| ")]
    rows = {cells[0]: cells[1:] for cells in table}
    bold = {k: sorted(name for name, cells in rows.items() if cells[k].startswith("**")) for k in range(5)}
    assert bold[0] == ["dynamic", "none"], "ties at 128: both bold"
    assert bold[3] == ["file:factors.json", "file:factors.json (vLLM)"]
    assert bold[4] == ["file:factors.json", "file:factors.json (vLLM)"], "the lowest Δ, not yarn's 0"
    assert rows["file:factors.json"][3] == "**4.127** [3.589, 4.746]"
    assert rows["pi"][0] == "30.426 [26.457, 34.990]"


def test_the_window_count_is_said_in_the_singular_for_one_window():
    assert describe_windows({"1024": 1}) == "1 window at every length"
    assert describe_windows({"512": 1, "1024": 4}) == "windows per length: 512: 1, 1024: 4"


# --- the command line: labels and output directories -----------------------------------------------------------


def factors_file(path: Path, top: float = 8.0, attention: float = 1.1) -> Path:
    long_factor = np.round(np.geomspace(1.0, top, 16), 2).tolist()
    block = longrope_block(long_factor, original=128, factor=8.0, attention_factor=attention)
    return write_factors_file(path, block, max_position_embeddings=1024)


def run_compare_cli(tmp_path: Path, *args: str) -> list[str]:
    """`longrope compare` on the demo config, small: 2 search and 4 test windows at 128 and 256 tokens."""
    settings = [f"output_dir={tmp_path / 'out'}", "data.search_windows=2", "data.test_windows=4"]
    sets = [part for setting in settings for part in ("--set", setting)]
    return ["compare", str(CONFIGS / "demo.yaml"), *sets, "--lengths", "128,256", *args]


def written_directory(stderr: str) -> Path:
    last = stderr.strip().splitlines()[-1]
    match = re.fullmatch(r"compare: wrote (.+)/ \(compare\.json, .*needle_heatmap\.png\)", last)
    assert match, last
    return Path(match.group(1))


def test_two_files_of_one_name_get_two_rows(tmp_path, fake_pool, capsys):
    a = factors_file(tmp_path / "a" / "factors.json", top=8.0)
    b = factors_file(tmp_path / "b" / "factors.json", top=9.0)
    assert main(run_compare_cli(tmp_path, "--factors", str(a), "--factors", str(b))) == 0
    (out,) = [p.parent for p in (tmp_path / "out").glob("compare*/compare.json")]
    methods = json.loads((out / "compare.json").read_text())["methods"]
    given = ["file:a/factors.json", "file:b/factors.json"]
    assert [name for name in methods if name not in BASELINES and not name.endswith("(vLLM)")] == given
    twins = ["ntk_tuned (vLLM)", *[f"{name} (vLLM)" for name in given]]
    assert [name for name in methods if name.endswith("(vLLM)")] == twins, "derived rows follow the labels"
    assert methods["file:a/factors.json"]["factors"] != methods["file:b/factors.json"]["factors"]
    table = (out / "compare.md").read_text()
    assert all(f"| {name} |" in table and f"| {name} (vLLM) |" in table for name in given)


def test_label_names_a_row(tmp_path, fake_pool, capsys):
    a = factors_file(tmp_path / "a" / "factors.json", top=8.0)
    mine = factors_file(tmp_path / "c" / "factors.json", top=7.0)
    assert main(run_compare_cli(tmp_path, "--factors", str(a), "--label", f"mine={mine}")) == 0
    (result,) = (tmp_path / "out").glob("compare*/compare.json")
    methods = json.loads(result.read_text())["methods"]
    assert {"file:factors.json", "mine", "mine (vLLM)"} <= set(methods), "a lone file keeps its bare name"
    assert methods["mine"]["factors"] != methods["file:factors.json"]["factors"]


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("same file twice", "is given twice; give each factors file or run directory once"),
        ("same file by two paths", "name the same file or folder"),
        ("two equal labels", "two rows labelled 'mine'"),
        ("label equal to a file's label", "two rows labelled 'file:factors.json'"),
        ("label of a baseline", "'yarn' is a baseline's row"),
        ("label without a path", "--label 'mine': expected NAME=PATH"),
    ],
)
def test_duplicate_rows_are_refused_before_scoring(case, message, tmp_path, refusing_pool, capsys):
    a = factors_file(tmp_path / "a" / "factors.json")
    b = factors_file(tmp_path / "b" / "factors.json", top=9.0)
    args = {
        "same file twice": ["--factors", str(a), "--factors", str(a)],
        "same file by two paths": ["--factors", str(a), "--label", f"x={tmp_path / 'a' / '..' / 'a' / 'factors.json'}"],
        "two equal labels": ["--label", f"mine={a}", "--label", f"mine={b}"],
        "label equal to a file's label": ["--factors", str(a), "--label", f"file:factors.json={b}"],
        "label of a baseline": ["--label", f"yarn={a}"],
        "label without a path": ["--label", "mine"],
    }[case]
    before = snapshot(tmp_path)
    assert main(run_compare_cli(tmp_path, *args)) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("longrope: error:") and message in lines[0], lines
    assert snapshot(tmp_path) == before, "nothing written: no windows cache, no output directory"


def test_factors_rows_use_the_shortest_distinguishing_suffix(tmp_path):
    run = tmp_path / "runs" / "mine"
    run.mkdir(parents=True)
    paths = [tmp_path / "x" / "a" / "f.json", tmp_path / "y" / "a" / "f.json", tmp_path / "g.json", run]
    rows = factors_rows([str(p) for p in paths])
    assert list(rows) == ["file:x/a/f.json", "file:y/a/f.json", "file:g.json", "run:mine"]
    assert factors_rows([str(paths[0])]) == {"file:f.json": str(paths[0])}, "alone: the bare name"


def test_each_run_writes_a_directory_of_its_own(tmp_path, fake_pool, capsys):
    a = factors_file(tmp_path / "a" / "factors.json")
    assert main(run_compare_cli(tmp_path, "--factors", str(a))) == 0
    first_err = capsys.readouterr().err
    (first,) = [p for p in (tmp_path / "out").iterdir() if p.name.startswith("compare")]
    first_files = snapshot(first)
    assert main(run_compare_cli(tmp_path, "--factors", str(a))) == 0
    runs = sorted(p for p in (tmp_path / "out").iterdir() if p.name.startswith("compare"))
    assert len(runs) == 2, "a second run must not write into the first one's directory"
    assert snapshot(first) == first_files, "the second run left the first run's results alone"
    second = written_directory(capsys.readouterr().err)
    assert written_directory(first_err) == first and second in runs and second != first
    for directory in runs:
        assert re.fullmatch(r"compare-\d{8}-\d{6}(-\d+)?", directory.name), directory.name
        assert sorted(p.name for p in directory.iterdir()) == sorted(compare.OUTPUT_FILES)


def test_a_non_empty_out_dir_is_refused_without_overwrite(tmp_path, fake_pool, capsys):
    a = factors_file(tmp_path / "a" / "factors.json")
    target = tmp_path / "results"
    target.mkdir()
    (target / "compare.json").write_text("{}")  # another run's results
    before = snapshot(tmp_path)
    assert main(run_compare_cli(tmp_path, "--factors", str(a), "-o", str(target))) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "--out-dir" in lines[0] and "not empty" in lines[0] and "--overwrite" in lines[0]
    assert snapshot(tmp_path) == before, "refused before any window is cut or cached"
    assert FakePool.built == 0
    assert main(run_compare_cli(tmp_path, "--factors", str(a), "-o", str(target), "--overwrite")) == 0
    assert written_directory(capsys.readouterr().err) == target
    assert json.loads((target / "compare.json").read_text())["methods"]


def test_coarse_tuning_and_no_needles_are_recorded(tmp_path, fake_pool, capsys, monkeypatch):
    """--tuning-grid coarse tries 3 x 3 NTK and 2 x 3 YaRN settings (LongRoPE's attention factor among each),
    --no-needles cuts no needle windows; both
    show in compare.json, and compare.md says no needle was scored instead of a column of "cannot run"."""
    from compare_fakes import FakePool

    sets = []
    original = FakePool.__init__

    def recording(self, context, window_sets):
        sets.extend(window_sets)
        original(self, context, window_sets)

    monkeypatch.setattr(FakePool, "__init__", recording)
    assert main(run_compare_cli(tmp_path, "--tuning-grid", "coarse", "--no-needles")) == 0
    (path,) = (tmp_path / "out").glob("compare*/compare.json")
    result = json.loads(path.read_text())
    assert result["tuning_grid"] == {"name": "coarse", "settings": 3 * 3 + 2 * 3}
    assert result["yarn_tuned"]["yarn_factor"] in {
        result["target_length"] / result["original_length"] * m for m in (1.0, 1.5)
    }
    assert {"ntk_tuned", "yarn_tuned"} <= set(result["methods"]) and all(kind != "needle" for kind, _ in sets)
    assert not any(row.get("needle") for row in result["methods"].values())
    assert "no needle windows scored" in (path.parent / "compare.md").read_text()


def test_a_vllm_twin_takes_its_rows_score_only_where_it_applies_the_same_numbers():
    """Past the original length (128 in the demo) both runtimes apply the long factors; the twin scales cos/sin by
    long_mscale, its row by attention_factor. An export writes both equal (for_both_runtimes): one score serves
    both. A file with a searched attention factor of 1.21 and no mscales gets vLLM's default sqrt(1 + ln 8 /
    ln 128) = 1.1902 instead, and a row keeping n_hat positions unscaled has no vLLM counterpart: both are scored."""
    from longrope.search.job.job_context import JobContext
    from longrope.search.optimizers.factory import load_job_config
    from longrope.search.reports.compare import same_as_twin, with_vllm_rows

    context = JobContext.resolve(load_job_config(CONFIGS / "demo.yaml", []))
    factors = np.linspace(1.0, 8.0, context.pairs)
    bare = context.longrope(factors, attention_factor=1.21)
    rows = with_vllm_rows(
        {"export": bare.for_both_runtimes(), "bare": bare, "n_hat": bare.model_copy(update={"n_hat_positions": 16})}
    )
    assert math.isclose(rows["bare (vLLM)"].attention_factor, math.sqrt(1 + math.log(8) / math.log(128)))
    same = {name: same_as_twin(name, 1024, context, rows) for name in rows}
    assert same == {
        "export": False,
        "bare": False,
        "n_hat": False,
        "export (vLLM)": True,
        "bare (vLLM)": False,
        "n_hat (vLLM)": False,
    }
    assert not any(same_as_twin(name, 128, context, rows) for name in rows), "at L0 the twin applies the long factors"


def test_a_job_under_2x_tries_the_settings_whose_factor_is_at_least_1(tmp_path, fake_pool, capsys):
    """At 128 -> 160 tokens (scale 1.25) the full grid's NTK multiplier 0.5 (factor 0.625) and 0.75 (0.9375) and
    YaRN's 0.75 would stretch the frequencies past the plain model's, which NtkRope and YarnRope refuse: they are
    left out, 5 x 8 NTK and 4 x 8 YaRN settings are tried, and compare.json counts those."""
    args = run_compare_cli(tmp_path)
    assert main([*args[: args.index("--lengths")], "--set", "target_length=160", "--lengths", "128,160"]) == 0
    (path,) = (tmp_path / "out").glob("compare*/compare.json")
    result = json.loads(path.read_text())
    assert result["tuning_grid"] == {"name": "full", "settings": 5 * 8 + 4 * 8}
    assert result["ntk_tuned"]["ntk_factor"] >= 1.0 and result["yarn_tuned"]["yarn_factor"] >= 1.0
    assert "(full grid, 72 settings)" in capsys.readouterr().err
