"""Run directories written by earlier commits still read: today's `status`, `export`, `compare --factors RUN` and
`search --resume` take each of them, an export equals what the old code exported, and an unfinished one resumes
to the result the old code reached.

The fixtures in tests/fixtures/old_runs/ were written by the commits their names start with (README.md there
says how), with the shipped reference model and tiny searches: each `<name>/` is a run directory as that code
left it, `<name>.export.json` what that code's `longrope export` wrote for it, and for a run killed
mid-generation `<name>.resumed.export.json` what that code exported once it had resumed the run to its end."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from run_file_shapes import FIXTURES, fixture_names

from longrope.search.cli.main import main
from longrope.search.run.run_formats import FORMAT

RUNS = fixture_names()
UNFINISHED = [name for name in RUNS if (FIXTURES / f"{name}.resumed.export.json").is_file()]
# what an export records of the code that wrote it, not of the run: the package version
OF_THE_EXPORTER = {"version"}
# the shipped reference model was retrained at a1ddb6d (2026-11-30): a run on its old weights cannot be continued on
# today's (the model is the user's own and does not change under a real run), so these are read but not resumed
OLD_REFERENCE_WEIGHTS = {"5089c0e"}


def copy_of(name: str, tmp_path: Path) -> Path:
    run = tmp_path / name
    shutil.copytree(FIXTURES / name, run)
    return run


def exported(run: Path, out: Path) -> dict:
    assert main(["export", str(run), "-o", str(out)]) == 0
    return json.loads(out.read_text())


def assert_same_export(today: dict, old: dict) -> None:
    """The factors, the attention factor and every provenance fact of the run are what the old code exported.

    Exports before 5841967 lack vLLM's `short_mscale` / `long_mscale` (today's add them, equal to the attention
    factor); provenance before 85bf958 counted `generations` with generation 0 in and had no `finished`."""
    assert {k: today["rope_parameters"][k] for k in old["rope_parameters"]} == old["rope_parameters"]
    assert today["max_position_embeddings"] == old["max_position_embeddings"]
    renumbered = set() if "finished" in old["provenance"] else {"generations"}
    shared = (set(today["provenance"]) & set(old["provenance"])) - OF_THE_EXPORTER - renumbered
    assert {k: today["provenance"][k] for k in shared} == {k: old["provenance"][k] for k in shared}
    assert {"best_perplexity", "config_hash", "model", "data_hash"} <= shared


def test_the_fixtures_cover_every_older_format_and_optimizer():
    """At least three commits; a run of every optimizer, a surrogate-screened GA and a staged (progressive) run,
    and one killed mid-generation; and a fixture of every format before this one (whoever raises run_formats.FORMAT
    adds one of the format it replaces)."""
    commits = {name.split("-")[0] for name in RUNS}
    assert len(commits) >= 3, RUNS
    searches = [json.loads((FIXTURES / n / "config.json").read_text())["config"]["search"] for n in RUNS]
    assert {"dim_mono", "cmaes", "gradient", "hybrid"} <= {s.get("optimizer", "dim_mono") for s in searches}
    assert any(s.get("surrogate", {}).get("enabled") for s in searches), "a screened GA"
    assert any(s.get("stages") for s in searches), "a staged run"
    assert UNFINISHED, "a run killed mid-generation"
    formats = {json.loads((FIXTURES / n / "config.json").read_text()).get("format", 1) for n in RUNS}
    assert set(range(1, FORMAT)) <= formats


@pytest.mark.parametrize("name", RUNS)
def test_status_reads_it(name, tmp_path, capsys):
    run = copy_of(name, tmp_path)
    assert main(["status", str(run), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    old = json.loads((FIXTURES / f"{name}.status.json").read_text())
    assert status["best_perplexity"] == old["best_perplexity"]
    assert status.get("best_key") == old.get("best_key", status.get("best_key"))  # absent before 85bf958


@pytest.mark.parametrize("name", RUNS)
def test_export_equals_the_old_codes_export(name, tmp_path):
    run = copy_of(name, tmp_path)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    today = exported(run, tmp_path / "factors.json")
    assert_same_export(today, json.loads((FIXTURES / f"{name}.export.json").read_text()))
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before, "export writes nothing there"


@pytest.mark.parametrize("name", RUNS)
def test_compare_takes_it_as_factors(name, tmp_path, fake_pool, capsys):
    run = copy_of(name, tmp_path)
    target = json.loads((run / "config.json").read_text())["config"]["target_length"]
    args = ["--set", "data.test_windows=2", "--lengths", f"128,{target}"]
    assert main(["compare", "--factors", str(run), *args]) == 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("compare: wrote "), last
    written = Path(last.removeprefix("compare: wrote ").split("/ (")[0])
    assert f"run:{name}" in json.loads((written / "compare.json").read_text())["methods"]


@pytest.mark.parametrize("name", sorted(set(RUNS) - set(UNFINISHED)))
def test_resuming_a_finished_one_says_so_and_changes_nothing(name, tmp_path, capsys):
    run = copy_of(name, tmp_path)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != "heartbeat.json"}
    assert main(["search", "--no-progress", "--resume", str(run)]) == 0
    old = json.loads((FIXTURES / f"{name}.export.json").read_text())["provenance"]
    assert json.loads(capsys.readouterr().out)["best_perplexity"] == old["best_perplexity"]
    after = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != "heartbeat.json"}
    assert after == before


@pytest.mark.slow
@pytest.mark.parametrize("name", [name for name in UNFINISHED if name.split("-")[0] not in OLD_REFERENCE_WEIGHTS])
def test_a_killed_one_resumes_to_the_result_the_old_code_reached(name, tmp_path):
    """Resumed by today's code on the shipped reference model (an embedded Ray), it reaches the old code's result:
    the same best candidate, and an export equal to the one the old code wrote after its own resume."""
    run = copy_of(name, tmp_path)
    longrope = shutil.which("longrope", path=str(Path(sys.executable).parent))  # its own process: its own Ray
    resumed = subprocess.run(
        [longrope, "search", "--no-progress", "--resume", str(run)], capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    today = exported(run, tmp_path / "factors.json")
    assert_same_export(today, json.loads((FIXTURES / f"{name}.resumed.export.json").read_text()))


def test_a_resume_checks_what_it_resolved_against_job_json_as_stored(tmp_path, capsys):
    """A resume resolves the model, windows and seeds again and holds them against job.json as `read_run` read it:
    a job.json that pins other seeds (here written as a resealed record, as if a seed file had changed since the
    run started) is refused in one line, and no run file is written (only the windows cache, which the check
    needs, may be: it is keyed by its contents)."""
    from cli_checks import snapshot

    from longrope.search.run.job_record import JobRecord

    run = copy_of("013706b-killed", tmp_path)
    job = JobRecord.model_validate_json((run / "job.json").read_text())
    (run / "job.json").write_text(json.dumps(job.model_copy(update={"seeds_hash": "0123456789abcdef"}).sealed()))

    def run_files():
        return {name: entry for name, entry in snapshot(run).items() if not name.startswith("windows-cache")}

    before = run_files()
    assert main(["search", "--no-progress", "--resume", str(run)]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "job.json: seeds_hash was '0123456789abcdef' when the run started, is now" in error, error
    assert run_files() == before


@pytest.mark.slow
def test_a_resume_writes_a_lost_job_json_again(tmp_path):
    """A run that lost job.json (killed between config.json and job.json, or deleted) resumes: the resume writes
    job.json again from what it resolved, the same record the old code wrote but for where today's model lives,
    and reaches the old code's result."""
    name = "013706b-killed"
    run = copy_of(name, tmp_path)
    (run / "job.json").unlink()
    longrope = shutil.which("longrope", path=str(Path(sys.executable).parent))
    resumed = subprocess.run(
        [longrope, "search", "--no-progress", "--resume", str(run)], capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    old, new = (json.loads((folder / "job.json").read_text()) for folder in (FIXTURES / name, run))
    where = {"model_dir", "record_hash"}  # the model's install path, and so the record's hash
    assert {k: v for k, v in new.items() if k not in where} == {k: v for k, v in old.items() if k not in where}
    expected = json.loads((FIXTURES / f"{name}.resumed.export.json").read_text())
    expected["provenance"]["model"] = new["model_dir"]  # the export names the model job.json now records
    assert_same_export(exported(run, tmp_path / "factors.json"), expected)
