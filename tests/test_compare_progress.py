"""compare shows its progress: every result it waits for is counted, per phase (the NTK settings tried, then
methods x window sets), as a bar with an ETA on a terminal and as plain lines when piped.

The worker pool underneath ComparePool is an in-process fake with WorkerPool's interface (compare_fakes.
InProcessPool), so ComparePool's own counting runs as it does on Ray."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from longrope.search.cli.main import main
from longrope.search.cli.progress import CountProgress
from longrope.search.reports import compare_scoring

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_compare_pool_reports_every_result_of_a_phase(in_process_pool):
    import numpy as np

    sets = {("perplexity", 8): _Windows(np.zeros((3, 9), dtype=np.int64)), ("tuning", 8): _Windows(np.zeros((2, 9)))}
    pool = compare_scoring.ComparePool(_Context(), sets)
    heard = []
    pool.score({"a": None, "b": None}, [("perplexity", 8), ("tuning", 8)], lambda *call: heard.append(call), "x")
    assert heard == [("x", done, 4) for done in range(1, 5)], "two methods on two sets: four results, each heard once"


def test_piped_progress_is_a_line_per_tenth_with_an_eta():
    out = io.StringIO()
    with CountProgress(Console(file=out, width=80), "compare") as progress:
        for done in range(1, 41):
            progress("method x window sets scored", done, 40)
    lines = out.getvalue().splitlines()
    assert len(lines) == 10 and "\x1b" not in out.getvalue()
    assert lines[0].startswith("compare: 4/40 method x window sets scored (10%), 0:00:00 elapsed, ETA ")
    assert lines[-1] == "compare: 40/40 method x window sets scored (100%), 0:00:00 elapsed"


def test_terminal_progress_keeps_count_and_eta_at_80_columns():
    out = io.StringIO()
    with CountProgress(Console(file=out, width=80, force_terminal=True, color_system=None), "compare") as progress:
        for done in range(1, 131):
            progress("method x window sets scored", done, 130)
    frames = [line for line in re.split(r"[\r\n]|\x1b\[[0-9;?]*[A-Za-z]", out.getvalue()) if line.startswith("compare")]
    assert "130/130 method x window sets scored" in frames[-1] and " ETA " in frames[-1]


@pytest.mark.slow
def test_compare_from_the_cli_reports_its_progress(tmp_path, in_process_pool, capsys):
    """The demo config, small (2 search and 4 test windows at 128 and 256 tokens), piped: both phases counted to
    their end: the full grid's 56 NTK and 40 YaRN settings, then 11 methods (6 closed forms, NTK's and YaRN's factors
    with LongRoPE's attention factor, tuned NTK and YaRN, and tuned NTK's vLLM twin; no factors given) on the 2 window
    sets at 128 tokens (perplexity and needles) and 10 on the 2 at 256, where the twin is its transformers row (past
    the original length both apply the long factors)."""
    settings = [f"output_dir={tmp_path / 'out'}", "data.search_windows=2", "data.test_windows=4"]
    args = ["compare", str(CONFIGS / "demo.yaml"), *[p for s in settings for p in ("--set", s)], "--lengths", "128,256"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "compare: 96/96 ntk and yarn settings tried (100%)" in err
    scored = re.search(r"compare: (\d+)/(\d+) method x window sets scored \(100%\)", err)
    assert scored and scored.group(1) == scored.group(2) == str(11 * 2 + 10 * 2), err


class _Windows:
    def __init__(self, tokens):
        self.tokens, self.loss_mask = tokens, None


class _Context:
    def model_spec(self):
        return None

    def pool_spec(self):
        return None
