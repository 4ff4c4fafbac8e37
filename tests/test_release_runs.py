"""Run directories written by every release still read: today's `status`, `export`, `compare --factors RUN` and
`search --resume` take each of them, an export equals what that release exported, and a run killed
mid-generation resumes to the result that release reached.

tests/fixtures/releases/<version>/ holds, per release, run directories that release's code wrote
(tests/release_fixtures.py, run when the release was cut): `<name>/` as it was left, `<name>.export.json` what
that release's `longrope export` wrote for it, and for a killed run `<name>.resumed.export.json` what it exported
once it had resumed a copy to the end."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_checks import snapshot
from run_file_shapes import RELEASES, release_runs, releases

from longrope.search.cli.main import main

RUNS = [(version, name) for version in releases() for name in release_runs(version)]
KILLED = [(version, name) for version, name in RUNS if (RELEASES / version / f"{name}.resumed.export.json").exists()]
FINISHED = [run for run in RUNS if run not in KILLED]
OF_THE_EXPORTER = {"version"}  # what an export records of the code that wrote it, not of the run


def ids(runs: list[tuple[str, str]]) -> list[str]:
    return [f"{version}/{name}" for version, name in runs]


def copy_of(version: str, name: str, tmp_path: Path) -> Path:
    run = tmp_path / name
    shutil.copytree(RELEASES / version / name, run)
    return run


def fixture_json(version: str, name: str, suffix: str) -> dict:
    return json.loads((RELEASES / version / f"{name}.{suffix}.json").read_text())


def exported(run: Path, out: Path) -> dict:
    assert main(["export", str(run), "-o", str(out)]) == 0
    return json.loads(out.read_text())


def assert_same_export(today: dict, old: dict) -> None:
    """The factors, the attention factor and every provenance fact of the run are what the release exported.

    Perplexities agree to float32 rounding, not bit for bit: a resume on another CPU scores its new candidates
    with other matmul kernels (torch dispatches AVX-512 or AVX2 code), which round differently in the last bits."""
    assert today["rope_parameters"] == old["rope_parameters"]
    assert today["max_position_embeddings"] == old["max_position_embeddings"]
    shared = (set(today["provenance"]) & set(old["provenance"])) - OF_THE_EXPORTER
    assert {"best_perplexity", "config_hash", "model", "data_hash"} <= shared
    assert {k: close(today["provenance"][k]) for k in shared} == {k: close(old["provenance"][k]) for k in shared}


def close(value):
    """A perplexity (or a mapping of them) to 6 significant digits; anything else as it is."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {key: close(item) for key, item in value.items()}
    return value


def test_every_release_has_a_run_of_every_optimizer_finished_and_killed():
    """Each release: a finished and a killed run of every optimizer (the GA, CMA-ES, descent, the hybrid), a
    steady GA killed (the one searcher whose own state state.json holds), a screened GA of each kind, a staged run."""
    assert releases(), "no release fixtures"
    for version in releases():
        runs = release_runs(version)
        configs = {name: json.loads((RELEASES / version / name / "config.json").read_text()) for name in runs}
        searches = {name: config["config"]["search"] for name, config in configs.items()}
        killed = {name for v, name in KILLED if v == version}
        for optimizer in ("dim_mono", "cmaes", "gradient", "hybrid"):
            of_it = {name for name, search in searches.items() if search["optimizer"] == optimizer}
            assert of_it - killed and of_it & killed, f"{version}: a finished and a killed {optimizer} run"
        screened = {name for name, search in searches.items() if search["surrogate"]["enabled"]}
        assert screened - killed and screened & killed, f"{version}: a finished and a killed screened GA"
        assert any(search["schedule"] == "steady" for name, search in searches.items() if name in killed)
        assert any(search["stages"] for search in searches.values()), f"{version}: a staged run"


@pytest.mark.parametrize(("version", "name"), RUNS, ids=ids(RUNS))
def test_status_reads_it(version, name, tmp_path, capsys):
    run = copy_of(version, name, tmp_path)
    assert main(["status", str(run), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    old = fixture_json(version, name, "status")
    assert (status["best_perplexity"], status["best_key"]) == (old["best_perplexity"], old["best_key"])
    assert (status["generation"], status["finished"]) == (old["generation"], old["finished"])


@pytest.mark.parametrize(("version", "name"), RUNS, ids=ids(RUNS))
def test_export_equals_the_releases_export(version, name, tmp_path):
    run = copy_of(version, name, tmp_path)
    before = snapshot(run)
    today = exported(run, tmp_path / "factors.json")
    assert_same_export(today, fixture_json(version, name, "export"))
    assert snapshot(run) == before, "export writes nothing there"


@pytest.mark.parametrize(("version", "name"), RUNS, ids=ids(RUNS))
def test_compare_takes_it_as_factors(version, name, tmp_path, fake_pool, capsys):
    run = copy_of(version, name, tmp_path)
    target = json.loads((run / "config.json").read_text())["config"]["target_length"]
    args = ["--set", "data.test_windows=2", "--lengths", f"128,{target}"]
    assert main(["compare", "--factors", str(run), *args]) == 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("compare: wrote "), last
    written = Path(last.removeprefix("compare: wrote ").split("/ (")[0])
    assert f"run:{name}" in json.loads((written / "compare.json").read_text())["methods"]


@pytest.mark.parametrize(("version", "name"), FINISHED, ids=ids(FINISHED))
def test_resuming_a_finished_one_says_so_and_changes_nothing(version, name, tmp_path, capsys):
    run = copy_of(version, name, tmp_path)
    before = {name: entry for name, entry in snapshot(run).items() if not name.endswith("heartbeat.json")}
    assert main(["search", "--no-progress", "--resume", str(run)]) == 0
    old = fixture_json(version, name, "export")["provenance"]
    assert json.loads(capsys.readouterr().out)["best_perplexity"] == old["best_perplexity"]
    after = {name: entry for name, entry in snapshot(run).items() if not name.endswith("heartbeat.json")}
    assert after == before


@pytest.mark.slow
@pytest.mark.parametrize(("version", "name"), KILLED, ids=ids(KILLED))
def test_a_killed_one_resumes_to_the_result_the_release_reached(version, name, tmp_path):
    """Resumed by today's code on the shipped reference model (an embedded Ray, in its own process), it reaches the
    release's result: an export equal to the one the release wrote after its own resume."""
    run = copy_of(version, name, tmp_path)
    longrope = shutil.which("longrope", path=str(Path(sys.executable).parent))
    command = [longrope, "search", "--no-progress", "--resume", str(run)]
    resumed = subprocess.run(command, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    today = exported(run, tmp_path / "factors.json")
    assert_same_export(today, fixture_json(version, name, "resumed.export"))


def test_a_resume_checks_what_it_resolved_against_job_json_as_stored(tmp_path, capsys):
    """A resume resolves the model, windows and seeds again and holds them against job.json as `read_run` read it:
    a job.json that pins other seeds (a resealed record, as if a seed file had changed since the run started) is
    refused in one line, and no run file is written (only the windows cache, which the check needs: it is keyed
    by its contents)."""
    from longrope.search.run.job_record import JobRecord

    version, name = KILLED[0]
    run = copy_of(version, name, tmp_path)
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
    job.json again from what it resolved, the record the release wrote but for where today's model lives, and
    reaches the release's result."""
    version, name = KILLED[0]
    run = copy_of(version, name, tmp_path)
    (run / "job.json").unlink()
    longrope = shutil.which("longrope", path=str(Path(sys.executable).parent))
    command = [longrope, "search", "--no-progress", "--resume", str(run)]
    resumed = subprocess.run(command, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    old, new = (json.loads((folder / "job.json").read_text()) for folder in (RELEASES / version / name, run))
    where = {"model_dir", "record_hash"}  # the model's install path, and so the record's hash
    assert {k: v for k, v in new.items() if k not in where} == {k: v for k, v in old.items() if k not in where}
    expected = fixture_json(version, name, "resumed.export")
    expected["provenance"]["model"] = new["model_dir"]  # the export names the model job.json now records
    assert_same_export(exported(run, tmp_path / "factors.json"), expected)
