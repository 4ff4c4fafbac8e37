"""`longrope status --json` as scripts read it (`RunStatus`): a progressive job's status is its latest started
stage's, named; a field is left out only where the run cannot say it yet. On the cheap known objective (no model,
no Ray)."""

from __future__ import annotations

import json
from pathlib import Path

from search_helpers import FunctionEvaluator, make_coordinator

from longrope.search.cli.main import main
from longrope.search.optimizers.factory import load_job_config
from longrope.search.optimizers.searcher import PolishProgress
from longrope.search.reports.status import format_status, run_status
from longrope.search.run.run_store import RunDir
from longrope.search.run.stages import stage_configs

RESUME = "resume with `longrope search --resume"


def job(run_dir: Path, *overrides: str):
    return load_job_config(None, ["target_length=256", "data.search_windows=1", f"output_dir={run_dir}", *overrides])


def test_a_progressive_job_s_status_is_its_latest_started_stage_named(tmp_path, capsys):
    """Between two stages the job is stopped "after stage 1" (no lock held), and `--resume` takes the job's
    directory; once the last stage ends, the job is finished. Only a job of stages has a `stage` field."""
    config = job(tmp_path, "search.stages=[128]", "search.generations=1")
    RunDir(tmp_path).create(config)
    first, last = stage_configs(config, tmp_path)
    RunDir(first.output_dir).create(first)
    make_coordinator(first, RunDir(first.output_dir), FunctionEvaluator()).run()

    between = run_status(RunDir(tmp_path))
    assert (between.stage, between.state, between.stop_reason) == ("1/2", "stopped", "after stage 1")
    assert between.run_dir == first.output_dir and between.resume_dir == str(tmp_path)
    assert "(stage 1/2)" in format_status(between) and f"{RESUME} {tmp_path}`" in format_status(between)
    assert main(["status", "--json", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["stage"] == "1/2"
    assert main(["status", "--json", first.output_dir]) == 0
    assert "stage" not in json.loads(capsys.readouterr().out)

    RunDir(last.output_dir).create(last)
    make_coordinator(last, RunDir(last.output_dir), FunctionEvaluator()).run()
    done = run_status(RunDir(tmp_path))
    assert (done.stage, done.state, done.stop_reason, done.finished) == ("2/2", "finished", None, True)


def test_status_json_prints_a_polish_whole_and_leaves_out_only_what_is_unset(tmp_path):
    """A polish that sets no `rounded` is printed whole: the JSON says `"rounded": false`. Unset top-level fields
    alone are left out (no job.json here: no model, no lengths)."""
    config = job(tmp_path, "search.generations=1")
    RunDir(tmp_path).create(config)
    make_coordinator(config, RunDir(tmp_path), FunctionEvaluator()).run()
    polish = PolishProgress(after_generation=1, steps_done=0, steps=4)
    shown = run_status(RunDir(tmp_path)).model_copy(update={"polish": polish}).as_json()
    assert shown["polish"] == {"after_generation": 1, "steps_done": 0, "steps": 4, "rounded": False}
    assert shown["eta_seconds"] is None and shown["stop_reason"] is None  # null, not absent
    assert not {"model", "target_length", "best_attention_factor", "stage"} & set(shown)
