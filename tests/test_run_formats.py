"""The run directory's format: config.json and state.json carry one, a run's hash is taken over its files as
written (so a field added later with a default never changes it), and a directory newer than the code is refused in
one line with nothing written."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_checks import cli_error_line
from run_dir_helpers import GRADIENT, HYBRID, cheap_config, descent_run, lines, rewrite_line, stopped_run
from search_helpers import known_problem_run
from test_old_run_dirs import FIXTURES

from longrope.search.cli.main import main
from longrope.search.run.run_formats import FORMAT, with_older_behaviour
from longrope.search.run.run_store import RunDir, RunStoreError


def sha16(fields: dict) -> str:
    """The identity hash, formulated again here: sha256 of the JSON with sorted keys, first 16 hex digits."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def files_of(run) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(run.iterdir()) if path.is_file()}


def test_config_json_and_state_json_carry_the_format_and_the_hash_of_what_is_written(tmp_path):
    run = stopped_run(tmp_path / "run")
    config = json.loads((run / "config.json").read_text())
    state = json.loads((run / "state.json").read_text())
    assert config["format"] == state["format"] == FORMAT == 5
    identity = {k: v for k, v in config["config"].items() if k not in ("output_dir", "workers")}
    identity["search"] = {k: v for k, v in identity["search"].items() if k != "tensorboard"}
    assert config["config_hash"] == sha16(identity) == state["config_hash"]


def test_a_field_added_later_with_a_default_leaves_a_runs_hash_as_it_was(tmp_path):
    """A run written before `search.surrogate` and `search.gradient.polish_method` existed (the fields taken out of
    its config.json, and its hash taken over what is left, as that code would have): today's code reads it as the
    same config, keeps its hash, and status and export read the run."""
    run = stopped_run(tmp_path / "run")
    document = json.loads((run / "config.json").read_text())
    stored = document["config"]
    del stored["search"]["surrogate"], stored["search"]["gradient"]["polish_method"]
    identity = {k: v for k, v in stored.items() if k not in ("output_dir", "workers")}
    identity["search"] = {k: v for k, v in identity["search"].items() if k != "tensorboard"}
    older_hash = sha16(identity)
    (run / "config.json").write_text(json.dumps({**document, "config_hash": older_hash}))
    for name in ("state.json", "job.json"):
        data = json.loads((run / name).read_text())
        data["config_hash"] = older_hash
        if name == "job.json":  # its own seal, over its fields as written
            data["record_hash"] = sha16({k: v for k, v in data.items() if k != "record_hash"})
        (run / name).write_text(json.dumps(data))
    run_dir = RunDir(run)
    assert run_dir.read_config() == cheap_config(run, "search.generations=3")
    assert run_dir.config_hash() == older_hash
    assert main(["status", str(run), "--json"]) == 0
    assert main(["export", str(run), "-o", str(tmp_path / "factors.json")]) == 0
    assert json.loads((tmp_path / "factors.json").read_text())["provenance"]["config_hash"] == older_hash


def test_an_edited_value_is_still_refused(tmp_path):
    run = stopped_run(tmp_path / "run")
    document = json.loads((run / "config.json").read_text())
    document["config"]["search"]["change_probability"] = 0.5
    (run / "config.json").write_text(json.dumps(document))
    with pytest.raises(RunStoreError, match=r"config\.json: config_hash does not match its config \(edited by hand"):
        RunDir(run).read_config()


@pytest.mark.parametrize("name", ["config.json", "state.json"])
@pytest.mark.parametrize("command", ["status", "export", "resume"])
def test_a_directory_newer_than_the_code_is_refused_in_one_line_with_nothing_written(tmp_path, capsys, name, command):
    run = stopped_run(tmp_path / "run")
    data = json.loads((run / name).read_text())
    (run / name).write_text(json.dumps({**data, "format": FORMAT + 1}))
    before = files_of(run)
    argv = {
        "status": ["status", str(run)],
        "export": ["export", str(run), "-o", str(tmp_path / "factors.json")],
        "resume": ["search", "--no-progress", "--resume", str(run)],
    }[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"longrope: error: {run / name}: format {FORMAT + 1} was written by a newer longrope-search (this one reads "
        f"formats 1 to {FORMAT}); upgrade longrope-search to read it (nothing was changed)\n"
    )
    assert files_of(run) == before and not (tmp_path / "factors.json").exists()


@pytest.mark.parametrize("value", [0, "2", 1.5, None])
def test_a_format_that_is_no_version_names_the_file_and_value(tmp_path, value):
    run = stopped_run(tmp_path / "run")
    data = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**data, "format": value}))
    with pytest.raises(RunStoreError, match=rf"config\.json: format must be a whole number >= 1, got {value!r}"):
        RunDir(run).read_config()


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda c: c["search"].update(change_probability=0.5), id="first-release-field"),
        pytest.param(lambda c: c["search"]["cmaes"].update(sigma=0.1), id="later-field-off-its-default"),
        pytest.param(lambda c: c["search"]["gradient"].update(steps=7), id="later-section-off-its-default"),
        pytest.param(lambda c: c["search"].pop("population"), id="field-deleted"),
    ],
)
def test_an_edited_format_1_config_is_refused(tmp_path, edit):
    """A format-1 run (written by e873457, the last commit before formats) whose config.json was edited by hand."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "e873457-gradient", run)
    RunDir(run).read_config()  # intact, it reads
    document = json.loads((run / "config.json").read_text())
    assert "format" not in document
    edit(document["config"])
    (run / "config.json").write_text(json.dumps(document))
    with pytest.raises(RunStoreError, match=r"config\.json: config_hash does not match its config \(edited by hand"):
        RunDir(run).read_config()


def test_a_stored_config_is_read_with_the_behaviour_its_run_had():
    """A field added later whose default changes what a run does is filled in with the old behaviour where the
    stored config lacks it, and only where it is in force."""
    hybrid = {"search": {"optimizer": "hybrid", "gradient": {"steps": 3}, "surrogate": {"enabled": True}}}
    assert with_older_behaviour(hybrid)["search"]["gradient"] == {"steps": 3, "polish_method": "adam"}
    assert with_older_behaviour(hybrid)["search"]["surrogate"] == {"enabled": True, "scored_share": 1.0}
    assert hybrid["search"]["gradient"] == {"steps": 3}, "the stored config is left as it is"
    ga = {"search": {"optimizer": "dim_mono", "gradient": {"steps": 3}, "surrogate": {"enabled": False}}}
    assert with_older_behaviour(ga) == ga, "not in force: a GA does not polish, a disabled surrogate does not screen"
    written_today = {"search": {"optimizer": "hybrid", "gradient": {"polish_method": "line_search"}}}
    assert with_older_behaviour(written_today) == written_today
    assert with_older_behaviour({"search": [1]}) == {"search": [1]}, "a damaged section is left to the model's check"


def test_a_newer_format_is_named_before_its_shape_is_read(tmp_path):
    run = stopped_run(tmp_path / "run")
    (run / "config.json").write_text(json.dumps({"format": FORMAT + 1, "settings": {}}))
    with pytest.raises(RunStoreError, match=rf"format {FORMAT + 1} was written by a newer longrope-search"):
        RunDir(run).read_config()


def test_a_resume_with_another_config_names_the_field_that_differs(tmp_path):
    run = stopped_run(tmp_path / "run")
    other = cheap_config(run, "search.generations=4")
    with pytest.raises(RunStoreError, match=r"holds a run of another config \(search\.generations differs\)"):
        RunDir(run).check_matches(other)


@pytest.mark.parametrize(
    "make_run",
    [
        lambda t: known_problem_run(t / "run", "search.generations=2"),
        lambda t: known_problem_run(t / "run", "search.generations=2", "search.optimizer=cmaes"),
        lambda t: descent_run(t / "run", GRADIENT),
        lambda t: descent_run(t / "run", HYBRID),
    ],
    ids=["ga", "cmaes", "gradient", "hybrid"],
)
def test_state_json_keeps_no_copy_of_what_the_history_holds(tmp_path, make_run):
    """Format 3 on: a searcher that a replay rebuilds has no state in state.json, only where it stands (progress),
    how it stopped and its timings; `status` reads the generation from there."""
    run = make_run(tmp_path)
    state = json.loads((run / "state.json").read_text())
    assert state["optimizer"]["state"] is None and state["progress"]["generation"] > 0
    kept = {"format", "config_hash", "optimizer", "progress", "generation_seconds", "polish_seconds", "finished"}
    assert set(state) <= kept | {"stopped_early", "total_generations"}
    assert main(["status", "--json", str(run)]) == 0


def test_the_steady_ga_keeps_its_own_state_but_not_the_history(tmp_path):
    """Its parents depend on the order results arrived in, which no replay of the history recovers; what it was
    told (genomes and scores, in the order told, and so the early stop's bests) is history.jsonl's, which format 5
    does not copy."""
    run = known_problem_run(tmp_path / "run", "search.schedule=steady", "search.generations=2")
    own = json.loads((run / "state.json").read_text())["optimizer"]["state"]
    assert own["rng"] and own["population"] and own["pending"] == [] and own["told"] is None
    assert own["early_stop"] is None  # format 5: history.jsonl's order gives the bests


def test_a_steady_resume_refuses_a_told_line_whose_factors_are_another_genomes(tmp_path, capsys, caplog):
    """The told genomes are rebuilt from history.jsonl's factors, each checked against its key: a line whose
    factors were edited to another point of the grid is refused in one line, every file as it was."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "71e00ff-steady-killed", run)
    child = next(n for n, r in enumerate(lines(run / "history.jsonl")) if r["generation"] == 1)
    rewrite_line(run / "history.jsonl", child, lambda r: {**r, "factors": [*r["factors"][:-1], r["factors"][-1] + 1]})
    line = cli_error_line(["search", "--no-progress", "--resume", str(run)], capsys, caplog, folder=tmp_path)
    assert "state.json: the steady search's state does not rebuild with history.jsonl's lines (candidate" in line
    assert "recorded factors are another genome's" in line


def test_a_steady_resume_refuses_a_history_that_lacks_a_told_candidate(tmp_path, capsys, caplog):
    """Format 4: what the GA was told is history.jsonl's final lines not among the asks out, as many as state.json
    counts; a told line deleted (not a parent's, which every reader refuses) is refused by the resume, every
    file as it was."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "71e00ff-steady-killed", run)
    state = json.loads((run / "state.json").read_text())
    own = state["optimizer"]["state"]
    (run / "state.json").write_text(
        json.dumps({**state, "format": 4, "optimizer": {"kind": "dim_mono", "state": {**own, "told": None}}})
    )
    records = lines(run / "history.jsonl")
    dropped = next(n for n, r in enumerate(records) if r["generation"] == 0 and r["key"] not in own["population"])
    (run / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for n, r in enumerate(records) if n != dropped))
    line = cli_error_line(["search", "--no-progress", "--resume", str(run)], capsys, caplog, folder=tmp_path)
    assert "history.jsonl holds 7 told candidates of generation 0 and 2 children, state.json counts 8 and 2" in line


def test_a_format_4_steady_states_early_stop_bests_are_not_what_a_resume_goes_by(tmp_path, capsys):
    """Format 4 kept the steady GA's early-stop bests, a copy of what history.jsonl's order gives: edited to a
    score no candidate has, and the stop made sticky, they are not read; the resume reaches what the old code
    reached resuming the fixture, and status reads the run as it was."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "a097ad3-steady-killed", run)
    state = json.loads((run / "state.json").read_text())
    assert state["format"] == 4
    state["optimizer"]["state"]["early_stop"] = {"best_by_generation": [0.001], "stopped": True}
    (run / "state.json").write_text(json.dumps(state))
    assert main(["status", "--json", str(run)]) == 0
    old_status = json.loads((FIXTURES / "a097ad3-steady-killed.status.json").read_text())
    assert json.loads(capsys.readouterr().out)["best_key"] == old_status["best_key"]
    longrope = shutil.which("longrope", path=str(Path(sys.executable).parent))  # its own process: its own Ray
    resumed = subprocess.run(
        [longrope, "search", "--no-progress", "--resume", str(run)], capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    export = json.loads((FIXTURES / "a097ad3-steady-killed.resumed.export.json").read_text())
    assert main(["export", str(run), "-o", str(tmp_path / "out.json")]) == 0
    today = json.loads((tmp_path / "out.json").read_text())
    assert today["rope_parameters"] == export["rope_parameters"]
    assert today["provenance"]["best_key"] == export["provenance"]["best_key"]


def test_an_older_state_jsons_copies_are_not_what_a_resume_goes_by(tmp_path, capsys):
    """A format-2 GA state.json's told scores and early-stop bests edited (each a copy of history.jsonl): every
    reader takes the run as it was, with the best the history holds (a replay rebuilds the GA on resume)."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "013706b-killed", run)
    state = json.loads((run / "state.json").read_text())
    evolution = state["optimizer"]["state"]
    evolution["told"] = [[genome, 0.001] for genome, _ in evolution["told"]]
    evolution["early_stop"]["best_by_generation"] = [0.001]
    (run / "state.json").write_text(json.dumps(state))
    assert main(["status", "--json", str(run)]) == 0
    status = json.loads(capsys.readouterr().out)
    old = json.loads((FIXTURES / "013706b-killed.status.json").read_text())
    assert (status["best_perplexity"], status["best_key"], status["generation"]) == (
        old["best_perplexity"],
        old["best_key"],
        old["generation"],
    )
