"""A run directory's files checked against each other, by every command that reads one.

The corrupted-directory suite: each corruption a user (or a copy between runs) can make, and each command that
reads a run directory (status, status --json, export, compare --factors RUN, search --resume) must refuse it in one
line naming the file that disagrees, with exit 2 and every file in the folder byte-identical afterwards. Then the
good paths the checks must not break: an unfinished run exports with a warning, and generations are numbered one
way in the log, status, status --json and the export.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from cli_checks import cli_error_line
from descent_corruptions import DESCENT_CORRUPTIONS, RESUME_CORRUPTIONS
from known_problem import problem
from rich.console import Console
from run_dir_helpers import (
    GRADIENT,
    append_line,
    cheap_config,
    descent_run,
    edit_json,
    lines,
    mid_polish,
    rewrite_line,
    scored,
    stopped_run,
)
from search_helpers import JOB_RECORD, FunctionEvaluator, known_problem_run, make_coordinator, write_job_record

from longrope.search.cli.main import main
from longrope.search.cli.reporter import ConsoleReporter
from longrope.search.optimizers.factory import make_searcher
from longrope.search.run.coordinator import Coordinator
from longrope.search.run.run_store import RunDir

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


# ---- corruptions: (how to damage a run directory, a substring of the one error line) ----


def target_length_edited(t: Path) -> Path:
    run = known_problem_run(t / "run")
    edit_json(run / "job.json", lambda job: {**job, "target_length": 512})
    return run


def legacy_job_target_length_edited(t: Path) -> Path:
    """A job.json of an older version (no hashes) edited: checked against config.json."""
    run = known_problem_run(t / "run")
    (run / "job.json").write_text(json.dumps({**JOB_RECORD, "target_length": 512}))
    return run


def job_from_another_run(t: Path) -> Path:
    run = known_problem_run(t / "run")
    config = cheap_config(t / "x", "search.generations=2")
    write_job_record(run, config)  # sealed, but with another run's config hash
    return run


def job_head_dim_edited(t: Path) -> Path:
    run = known_problem_run(t / "run")
    (run / "job.json").write_text(json.dumps({**JOB_RECORD, "head_dim": 64}))  # legacy: no hash to catch it
    return run


def history_line_from_another_run(t: Path) -> Path:
    """A line scored on 2 windows (another run's data.search_windows) appended to a 1-window run."""
    run = known_problem_run(t / "run")
    record = lines(run / "history.jsonl")[0]
    append_line(run / "history.jsonl", {**record, "key": "f" * 20, "nll": [0.5, 0.6], "tokens": [1, 1]})
    return run


def duplicate_final_line(t: Path) -> Path:
    run = known_problem_run(t / "run")
    record = lines(run / "history.jsonl")[3]
    append_line(run / "history.jsonl", scored(record, record["mean_nll"] / 2))
    return run


def negative_mean_nll(t: Path) -> Path:
    run = known_problem_run(t / "run")
    rewrite_line(run / "history.jsonl", 2, lambda r: {**r, "mean_nll": -5.0, "perplexity": math.exp(-5.0)})
    return run


def perplexity_not_exp(t: Path) -> Path:
    run = known_problem_run(t / "run")
    rewrite_line(run / "history.jsonl", 2, lambda r: {**r, "perplexity": 1.0001})
    return run


def mean_nll_not_its_windows(t: Path) -> Path:
    run = known_problem_run(t / "run")
    rewrite_line(run / "history.jsonl", 2, lambda r: {**r, "mean_nll": r["mean_nll"] / 2, "perplexity": None})
    rewrite_line(run / "history.jsonl", 2, lambda r: {**r, "perplexity": math.exp(r["mean_nll"])})
    return run


def scored_on_other_windows(t: Path) -> Path:
    """A line whose windows' hash is another run's (the same count and tokens: only the hash tells)."""
    run = known_problem_run(t / "run")
    rewrite_line(run / "history.jsonl", 2, lambda r: {**r, "windows": "0" * 64})
    return run


def four_factors(t: Path) -> Path:
    run = known_problem_run(t / "run")
    rewrite_line(run / "history.jsonl", 1, lambda r: {**r, "factors": r["factors"][:4]})
    return run


def foreign_state(t: Path) -> Path:
    other = t / "other"
    config = cheap_config(other, "search.generations=3")
    RunDir(other).create(config)
    make_coordinator(config, RunDir(other), FunctionEvaluator()).run()
    run = known_problem_run(t / "run")
    (run / "state.json").write_bytes((other / "state.json").read_bytes())
    return run


def foreign_legacy_state(t: Path) -> Path:
    """A state.json stripped of its config hash, from a 3-generation run, in a 1-generation run: caught by its
    generation counts."""
    run = foreign_state(t)
    edit_json(run / "state.json", lambda state: {k: v for k, v in state.items() if k != "config_hash"})
    return run


def steady_run(t: Path) -> Path:
    """A steady GA's run: the one whose own state state.json holds (generator, parents, asks out); what it was
    told, and so the early stop's bests, is history.jsonl's."""
    return known_problem_run(t / "run", "search.schedule=steady", "search.generations=2")


def steady_parent_never_told(t: Path) -> Path:
    run = steady_run(t)
    state = json.loads((run / "state.json").read_text())
    state["optimizer"]["state"]["population"] = ["f" * 20]
    (run / "state.json").write_text(json.dumps(state))
    return run


def history_emptied(t: Path) -> Path:
    run = known_problem_run(t / "run")
    (run / "history.jsonl").write_text("")
    return run


def history_deleted(t: Path) -> Path:
    run = known_problem_run(t / "run")
    (run / "history.jsonl").unlink()
    return run


def state_deleted_mid_run(t: Path) -> Path:
    run = stopped_run(t / "run")
    (run / "state.json").unlink()
    return run


def stopped_run_job_edited(t: Path) -> Path:
    run = stopped_run(t / "run")
    edit_json(run / "job.json", lambda job: {**job, "rope_theta": 500000.0})
    return run


def symlink_loop(t: Path) -> Path:
    loop = t / "loop"
    loop.symlink_to(loop)
    return loop


def path_of_10000_characters(t: Path) -> Path:
    return Path(str(t) + ("/" + "d" * 200) * 50)


CORRUPTIONS = [
    pytest.param(target_length_edited, "job.json: record_hash does not match its fields", id="job-target-edited"),
    pytest.param(
        legacy_job_target_length_edited,
        "job.json: target_length is 512, but config.json says 256",
        id="legacy-job-target-edited",
    ),
    pytest.param(job_from_another_run, "job.json: belongs to another run (config hash", id="job-of-another-run"),
    pytest.param(job_head_dim_edited, "16 factors, but the model has 32 rotary pairs", id="job-head-dim-64"),
    pytest.param(
        history_line_from_another_run,
        "2 window NLLs for a scored candidate, but the run has 1 search windows",
        id="history-line-of-another-run",
    ),
    pytest.param(duplicate_final_line, "history.jsonl:97: a second record for candidate", id="history-final-twice"),
    pytest.param(
        negative_mean_nll, "history.jsonl:3: corrupted line (mean_nll: Input should be greater", id="mean-nll-below-0"
    ),
    pytest.param(perplexity_not_exp, "perplexity: must be exp(mean_nll)", id="perplexity-not-exp"),
    pytest.param(mean_nll_not_its_windows, "but its per-window NLLs give", id="mean-nll-not-its-windows"),
    pytest.param(
        scored_on_other_windows,
        "history.jsonl:3: scored on other windows (hash " + "0" * 64 + ", job.json's",
        id="scored-on-other-windows",
    ),
    pytest.param(four_factors, "history.jsonl:2: 4 factors, but the model has 16 rotary pairs", id="four-factors"),
    pytest.param(foreign_state, "state.json: belongs to another run", id="state-of-another-run"),
    pytest.param(
        foreign_legacy_state,
        "state.json: total_generations is 4, but config.json gives 2",
        id="legacy-state-of-another-run",
    ),
    pytest.param(
        steady_parent_never_told,
        "state.json: population holds " + "f" * 20 + ", which history.jsonl does not hold as told",
        id="steady-parent-never-told",
    ),
    pytest.param(
        history_emptied, "history.jsonl: holds no scored candidate, but state.json has reached", id="history-emptied"
    ),
    pytest.param(
        history_deleted, "history.jsonl: holds no scored candidate, but state.json has reached", id="history-deleted"
    ),
    pytest.param(
        state_deleted_mid_run, "state.json: missing, but history.jsonl holds candidates of generation", id="no-state"
    ),
    pytest.param(stopped_run_job_edited, "job.json: record_hash does not match", id="unfinished-job-edited"),
    pytest.param(symlink_loop, ": a symbolic link loop (a link that points back to itself)", id="run-dir-symlink-loop"),
    pytest.param(path_of_10000_characters, ": path too long for this system (a name is at most 255", id="path-10000"),
    *DESCENT_CORRUPTIONS,
]

COMMANDS = {
    "status": lambda run, t: ["status", str(run)],
    "status-json": lambda run, t: ["status", "--json", str(run)],
    "status-plot": lambda run, t: ["status", str(run), "--plot", str(t / "p.png")],
    "export": lambda run, t: ["export", str(run), "-o", str(t / "factors.json")],
    "compare": lambda run, t: ["compare", str(CONFIGS / "demo.yaml"), "--factors", str(run), "-o", str(t / "cmp")],
    "resume": lambda run, t: ["search", "--no-progress", "--resume", str(run)],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(("corrupt", "expected"), CORRUPTIONS)
def test_every_reader_refuses_a_damaged_run_directory(corrupt, expected, command, tmp_path, capsys, caplog):
    run = corrupt(tmp_path)
    line = cli_error_line(COMMANDS[command](run, tmp_path), capsys, caplog, folder=tmp_path)
    assert expected in line


@pytest.mark.parametrize(("corrupt", "expected"), RESUME_CORRUPTIONS)
def test_a_resume_refuses_a_line_its_replay_does_not_ask_for(corrupt, expected, tmp_path, capsys, caplog):
    """Found by replaying the history (only a resume does): refused in one line, every file as it was."""
    run = corrupt(tmp_path)
    line = cli_error_line(COMMANDS["resume"](run, tmp_path), capsys, caplog, folder=tmp_path)
    assert expected in line


def test_the_undamaged_runs_read_cleanly(tmp_path, capsys):
    """The corruptions' starting points are sound: each command above fails for the damage, not the fixture."""
    runs = (
        known_problem_run(tmp_path / "finished"),
        stopped_run(tmp_path / "stopped"),
        mid_polish(tmp_path / "polish"),
    )
    for run in (*runs, descent_run(tmp_path / "gradient", GRADIENT, fail_on_call=4)):
        assert main(["status", str(run)]) == 0
        assert main(["export", str(run), "-o", str(run / "f.json")]) == 0


# ---- an unfinished search exports its best so far, and says so ----


def test_export_of_an_unfinished_search_warns_and_records_it(tmp_path, capsys):
    run = stopped_run(tmp_path / "run")
    capsys.readouterr()
    assert main(["export", str(run), "-o", str(tmp_path / "f.json")]) == 0
    err = capsys.readouterr().err
    assert "export: warning: the search in" in err and "is not finished (generation 1/3 done" in err
    provenance = json.loads((tmp_path / "f.json").read_text())["provenance"]
    assert provenance["finished"] is False and provenance["generation"] == 1 and provenance["generations"] == 3
    finished = known_problem_run(tmp_path / "done")
    assert main(["export", str(finished), "-o", str(tmp_path / "g.json")]) == 0
    assert "warning" not in capsys.readouterr().err
    assert json.loads((tmp_path / "g.json").read_text())["provenance"]["finished"] is True


# ---- one numbering of generations ----


def generation_log(config, run_dir: RunDir) -> list[str]:
    """The generation lines the coordinator logs for a run of `config` (plain lines, as when piped)."""
    console = Console(record=True, width=200, force_terminal=False)
    search_problem = problem(1)
    optimizer = make_searcher(
        config.search, pairs=search_problem.pairs, scale=search_problem.scale, seeds=search_problem.seeds
    )
    evaluator = FunctionEvaluator()
    Coordinator(
        config.search,
        search_problem,
        run_dir,
        evaluator,
        optimizer,
        reporter=ConsoleReporter(console, show_progress=False),
    ).run()
    return [line for line in console.export_text().splitlines() if line.startswith("generation")]


@pytest.mark.parametrize("optimizer", ["dim_mono", "cmaes"])
def test_generations_are_numbered_one_way_in_the_log_status_and_export(optimizer, tmp_path, capsys):
    """A 2-generation search logs generation 0 (the initial population), 1 and 2, each "of 2"; status, status
    --json and the export's provenance all say generation 2 of 2. CMA-ES makes as many generations as its
    evaluation budget gives, and every view says the same number."""
    run = tmp_path / "run"
    config = cheap_config(run, "search.generations=2", f"search.optimizer={optimizer}")
    RunDir(run).create(config)
    write_job_record(run, config)
    logged = [re.match(r"generation (\d+)/(\d+)", line).groups() for line in generation_log(config, RunDir(run))]
    done, last = map(int, logged[-1])
    assert [int(g) for g, _ in logged] == list(range(done + 1)) and done == last
    if optimizer == "dim_mono":
        assert last == 2, "the GA's last generation is search.generations"
    capsys.readouterr()
    assert main(["status", str(run)]) == 0
    assert f"generation {last}/{last} done" in capsys.readouterr().out
    assert main(["status", "--json", str(run)]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["generation"], status["generations"]) == (last, last)
    assert main(["export", str(run), "-o", str(tmp_path / "f.json")]) == 0
    provenance = json.loads((tmp_path / "f.json").read_text())["provenance"]
    assert (provenance["generation"], provenance["generations"]) == (last, last)


def test_a_run_before_its_first_generation_ends_says_so(tmp_path, capsys):
    run = tmp_path / "run"
    config = cheap_config(run)
    RunDir(run).create(config)
    assert main(["status", "--json", str(run)]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["generation"] is None and status["generations"] == config.search.generations
