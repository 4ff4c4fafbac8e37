"""The coordinator with a cheap known objective (no model): optimum found, crash + resume equals a clean run."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from known_problem import OPTIMUM, objective, problem
from search_helpers import JOB_RECORD, FunctionEvaluator, make_coordinator, replayed_state, run_job

from longrope.search.config.job_config import JobConfig
from longrope.search.run.run_store import RunDir, RunStoreError, best_of


def job(tmp_path, **search) -> JobConfig:
    return JobConfig.model_validate(
        {
            "target_length": 256,
            "output_dir": str(tmp_path),
            "data": {"search_windows": 1},  # FunctionEvaluator's one window
            "search": {"generations": 12, "seed": 4, **search},
        }
    )


def test_finds_the_known_optimum(tmp_path):
    config = job(tmp_path, generations=40)
    best, _ = run_job(config, RunDir(tmp_path), FunctionEvaluator())
    seed_best = min(objective(seed.factors) for seed in problem().seeds)
    assert best.mean_nll < 0.05 * seed_best
    assert np.abs(np.asarray(best.factors) - OPTIMUM).max() < 0.35
    state = json.loads((tmp_path / "state.json").read_text())
    early_stop = replayed_state(config, RunDir(tmp_path))["early_stop"]
    assert state["finished"] and len(early_stop["best_by_generation"]) == 41
    coordinator_best = min(
        (json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()),
        key=lambda record: record["mean_nll"],
    )
    assert best_of(RunDir(tmp_path).read_history()) == best and best.line() == json.dumps(coordinator_best)
    lines = (tmp_path / "history.jsonl").read_text().splitlines()
    assert len(lines) == len({json.loads(line)["key"] for line in lines}), "no candidate scored twice"


def test_crash_then_resume_reaches_the_uninterrupted_result(tmp_path):
    clean_dir, crash_dir = RunDir(tmp_path / "clean"), RunDir(tmp_path / "crash")
    config = job(tmp_path)
    clean_best, _ = run_job(config, clean_dir, FunctionEvaluator())
    crashing = FunctionEvaluator(fail_on_call=5)  # dies in generation 4, after one result of it is saved
    with pytest.raises(RuntimeError, match="simulated coordinator crash"):
        run_job(config, crash_dir, crashing)
    resumed_evaluator = FunctionEvaluator()
    resumed_best, _ = run_job(config, crash_dir, resumed_evaluator, resume=True)
    assert resumed_best == clean_best
    clean_state = json.loads(clean_dir.file("state.json").read_text())
    resumed_state = json.loads(crash_dir.file("state.json").read_text())
    assert resumed_state["optimizer"] == clean_state["optimizer"]
    assert resumed_state["progress"] == clean_state["progress"]
    assert clean_dir.read_history().keys() == crash_dir.read_history().keys()
    assert crashing.evaluated + resumed_evaluator.evaluated == len(clean_dir.read_history()), "nothing scored twice"


def test_resume_refuses_another_config_and_a_corrupted_state(tmp_path):
    run_dir = RunDir(tmp_path)
    config = job(tmp_path, generations=2)
    run_job(config, run_dir, FunctionEvaluator())
    with pytest.raises(RunStoreError, match="already holds this run; continue it with --resume"):
        run_dir.create(config)
    with pytest.raises(RunStoreError, match="holds a run of another config"):
        run_dir.create(job(tmp_path, generations=3))
    (tmp_path / "state.json").write_text('{"evolution": {"generation": ')
    with pytest.raises(RunStoreError, match=r"state\.json: corrupted"):
        run_job(config, run_dir, FunctionEvaluator(), resume=True)


def test_early_stop_after_patience_without_improvement(tmp_path):
    config = job(tmp_path, generations=30, early_stop={"patience": 2, "min_improvement": 10.0})
    run_job(config, RunDir(tmp_path), FunctionEvaluator())
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["stopped_early"] and state["finished"]
    best_by_generation = replayed_state(config, RunDir(tmp_path))["early_stop"]["best_by_generation"]
    assert len(best_by_generation) == 3, "stops once 2 generations failed to improve by 10 nats"


def test_export_refuses_n_hat_unless_asked(tmp_path):
    from longrope.search.export.factors_export import ExportError, factors_file_of_run
    from longrope.search.run.run_store import write_json_atomic

    config = job(tmp_path, generations=1, n_hat={"enabled": True, "choices": [0, 8]})
    run_job(config, RunDir(tmp_path), FunctionEvaluator())
    write_json_atomic(tmp_path / "job.json", JOB_RECORD)
    best = best_of(RunDir(tmp_path).read_history())
    better = best.mean_nll / 2  # a better candidate with n_hat, as a search may find (its line self-consistent)
    line = {
        **json.loads(best.line()),
        "key": "n-hat-8",
        "n_hat": 8,
        "mean_nll": better,
        "perplexity": math.exp(better),
        "nll": [better],
    }
    with (tmp_path / "history.jsonl").open("a") as history:
        history.write(json.dumps(line) + "\n")
    with pytest.raises(ExportError, match="n_hat = 8, which transformers and vLLM cannot express"):
        factors_file_of_run(RunDir(tmp_path))
    exported = factors_file_of_run(RunDir(tmp_path), allow_n_hat=True)
    assert "n_hat" not in exported.rope_parameters.model_dump() and exported.provenance.model_extra["n_hat"] == 8
    assert exported.rope_parameters.long_factor == pytest.approx(best.factors)


def test_another_runs_best_seeds_a_new_search(tmp_path):
    from longrope.search.job.job_context import JobContext
    from longrope.search.optimizers.factory import load_job_config

    first = job(tmp_path / "first", generations=1)
    run_job(first, RunDir(tmp_path / "first"), FunctionEvaluator())
    best = best_of(RunDir(tmp_path / "first").read_history())
    # the reference model has 16 pairs, as the cheap problem does
    config = load_job_config(None, ["target_length=1024", f"search.seed_files=[{tmp_path / 'first'}]"])
    seed, moved = [s for s in JobContext.resolve(config).seeds() if s.name.startswith("file:")]
    assert seed.factors.tolist() == best.factors and seed.attention_factor == best.attention_factor
    # a run at another length also seeds its factors moved to this one: 1 + (lambda - 1)(S' - 1)/(S - 1)
    other_scale = first.target_length / 128  # the reference model's original length, as this job reads it
    expected = [1 + (f - 1) * (1024 / 128 - 1) / (other_scale - 1) for f in best.factors]
    assert moved.name == f"{seed.name}@1024" and moved.factors.tolist() == pytest.approx(expected)
    # the same run exported: a factors file searched for another length seeds both as well (its
    # max_position_embeddings is the length it was searched for), and one for this length seeds itself only
    exported = tmp_path / "first.json"
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "long_factor": best.factors, "short_factor": [1.0] * 16}
    rope |= {"original_max_position_embeddings": 128, "factor": other_scale, "attention_factor": best.attention_factor}
    provenance = {"created_by": "test", "method": "longrope", "method_rope_parameters": {}}
    exported.write_text(
        json.dumps({"rope_parameters": rope, "max_position_embeddings": first.target_length, "provenance": provenance})
    )
    from_file = load_job_config(None, ["target_length=1024", f"search.seed_files=[{exported}]"])
    seeds = [s for s in JobContext.resolve(from_file).seeds() if s.name.startswith("file:")]
    assert [s.name for s in seeds] == ["file:first.json", "file:first.json@1024"]
    assert seeds[1].factors.tolist() == pytest.approx(expected)
    same = load_job_config(None, [f"target_length={first.target_length}", f"search.seed_files=[{exported}]"])
    assert [s.name for s in JobContext.resolve(same).seeds() if s.name.startswith("file:")] == ["file:first.json"]


class DivergingEvaluator(FunctionEvaluator):
    """Every candidate's loss overflows: the case of a model that reads nothing at this length."""

    def _score(self, candidate, windows, gradient=False):
        score = super()._score(candidate, windows, gradient)
        return dataclasses.replace(score, nll=(math.inf,) * len(score.nll))


def test_a_search_whose_every_candidate_diverged_is_refused_in_one_line_then_and_on_resume(tmp_path, capsys):
    from longrope.search.cli.main import main

    config = job(tmp_path, generations=1)
    with pytest.raises(RunStoreError, match="no candidate got a finite score"):
        run_job(config, RunDir(tmp_path), DivergingEvaluator())
    assert json.loads((tmp_path / "state.json").read_text())["finished"]
    history = (tmp_path / "history.jsonl").read_bytes()
    assert main(["search", "--resume", str(tmp_path)]) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "ended with no candidate of finite score" in line and "history.jsonl" in line
    assert (tmp_path / "history.jsonl").read_bytes() == history
    assert main(["export", str(tmp_path), "-o", str(tmp_path / "factors.json")]) == 2
    assert "ended with no candidate of finite score" in capsys.readouterr().err
    assert not (tmp_path / "factors.json").exists()
    assert main(["status", str(tmp_path), "--plot"]) == 2
    assert "every candidate scored has a non-finite NLL; nothing to plot" in capsys.readouterr().err


def test_an_unfinished_search_whose_every_candidate_diverged_says_so_not_that_it_is_starting(tmp_path, capsys):
    from longrope.search.cli.main import main

    config = job(tmp_path, generations=2)
    with pytest.raises(RuntimeError, match="simulated coordinator crash"):
        run_job(config, RunDir(tmp_path), DivergingEvaluator(fail_on_call=2))
    assert main(["export", str(tmp_path), "-o", str(tmp_path / "factors.json")]) == 2
    line = capsys.readouterr().err.strip()
    assert line.endswith(
        "history.jsonl: every candidate scored so far has a non-finite NLL; check the model and the data"
    )


class CrashingAfter(FunctionEvaluator):
    """Dies after `results` results have landed, in whichever as_completed call that falls (a steady run asks and
    tells within one)."""

    def __init__(self, results: int):
        super().__init__()
        self.left = results

    def as_completed(self):
        for item in super().as_completed():
            if self.left == 0:
                raise RuntimeError("simulated coordinator crash")
            self.left -= 1
            yield item


@pytest.mark.parametrize("results", [100, 200, 330])
def test_a_steady_resume_replays_the_early_stops_bests_as_the_run_recorded_them(tmp_path, results):
    """Format 5 stores no early-stop bests: a resume replays them from history.jsonl's order. They equal what the
    crashed run itself recorded after each generation, and the resumed run goes on to its early stop."""
    config = job(tmp_path, schedule="steady", generations=20, early_stop={"patience": 2, "min_improvement": 0.001})
    RunDir(tmp_path).create(config)
    crashed = make_coordinator(config, RunDir(tmp_path), CrashingAfter(results))
    with pytest.raises(RuntimeError, match="simulated coordinator crash"):
        crashed.run()
    assert json.loads((tmp_path / "state.json").read_text())["optimizer"]["state"]["early_stop"] is None
    rebuilt = make_coordinator(config, RunDir(tmp_path), FunctionEvaluator(), resume=True).searcher
    recorded = crashed.searcher.early_stop.best_by_generation
    assert len(recorded) >= 2 and rebuilt.early_stop.best_by_generation == recorded
    assert rebuilt.early_stop.stopped is crashed.searcher.early_stop.stopped is False
    run_job(config, RunDir(tmp_path), FunctionEvaluator(), resume=True)
    assert json.loads((tmp_path / "state.json").read_text())["progress"]["stopped_early"]


def test_a_resumed_generations_rate_counts_only_what_this_process_scored(tmp_path, monkeypatch):
    """The generation line's eval/s: a run killed after 1 result of generation 2 resumes and scores the other 31
    children of it; the line's rate is those 31 over its seconds, not the 32 the history holds."""
    from longrope.search.optimizers.searcher import GenerationEnd
    from longrope.search.run import coordinator, generation_log

    config = job(tmp_path, generations=3)
    with pytest.raises(RuntimeError, match="simulated coordinator crash"):
        run_job(config, RunDir(tmp_path), FunctionEvaluator(fail_on_call=3))
    lines = []

    def spied(end, history, **kwargs):
        lines.append((end.generation, kwargs["scored"], sum(r.generation == end.generation for r in history.values())))
        return generation_log.generation_line(end, history, **kwargs)

    monkeypatch.setattr(coordinator, "generation_line", spied)
    run_job(config, RunDir(tmp_path), FunctionEvaluator(), resume=True)
    assert lines == [(2, 31, 32), (3, 32, 32)]
    end = GenerationEnd("generation 1/3", 1, 0.5, 0.6)
    text = generation_log.generation_line(end, {}, racing=False, seconds=4.0, scored=10)
    assert text.endswith("(4.0s, 2.50 eval/s)")


@pytest.mark.parametrize("writes", [40, 100, 150])  # 100: the lagging child ends generation 3
def test_a_steady_run_killed_before_its_state_caught_up_replays_the_bests_it_recorded(tmp_path, monkeypatch, writes):
    """The crash between a result's line and the next state.json: the state counts fewer told children than the
    history holds. The resume tells those lines first, in line order, as it goes on; once told, the early stop's
    bests are what the crashed run recorded."""
    config = job(tmp_path, schedule="steady", generations=20, early_stop={"patience": 2, "min_improvement": 0.001})
    RunDir(tmp_path).create(config)
    crashed = make_coordinator(config, RunDir(tmp_path), FunctionEvaluator())
    write_state, calls = RunDir.write_state, []

    def dies_after(self, state):
        calls.append(None)
        if len(calls) > writes:
            raise RuntimeError("simulated crash before state.json")
        write_state(self, state)

    monkeypatch.setattr(RunDir, "write_state", dies_after)
    with pytest.raises(RuntimeError, match=r"simulated crash before state\.json"):
        crashed.run()
    monkeypatch.setattr(RunDir, "write_state", write_state)
    stored = json.loads((tmp_path / "state.json").read_text())["optimizer"]["state"]["children_told"]
    assert stored < crashed.searcher.children_told, "the state lags the history"
    resumed = make_coordinator(config, RunDir(tmp_path), CrashingAfter(0), resume=True)
    with pytest.raises(RuntimeError, match="simulated coordinator crash"):
        resumed.run()  # tells what history.jsonl holds, asks anew, and dies before any new result lands
    assert resumed.searcher.children_told == crashed.searcher.children_told
    recorded = crashed.searcher.early_stop.best_by_generation
    assert len(recorded) >= 2 and resumed.searcher.early_stop.best_by_generation == recorded
