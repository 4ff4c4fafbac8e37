"""A search that outlives a bad worker: whole searches of the known problem (no model) through the real worker pool
on a local Ray, with workers that fail on purpose (tests/faulty_function_workers.py). A task that raises once, an
actor killed mid-task and a worker that fails every task cost nothing: the search ends with the uninterrupted run's
history and best. A candidate that fails on every worker is recorded as failed, ranks last, and the run finishes;
`status`, `export` and `--resume` read it. (A node removed mid-search: tests/test_pool_cluster.py.)"""

from __future__ import annotations

import json
import math

import pytest
from faulty_function_workers import FunctionWorker, fault_folder, function_model, is_poisoned, score_calls
from search_helpers import FunctionEvaluator, run_job, write_job_record

from longrope.search.config.job_config import JobConfig
from longrope.search.export.factors_export import factors_file_of_run
from longrope.search.optimizers.history_record import HistoryRecord
from longrope.search.reports.status import run_status
from longrope.search.run.run_store import RunDir
from longrope.workers.errors import WorkerPoolError
from longrope.workers.placement import actor_options
from longrope.workers.pool import WorkerPool
from longrope.workers.specs import PoolSpec
from longrope.workers.task_failure import TaskFailure

POISON = 4  # about one candidate in four fails on every worker


def job(tmp_path, **search) -> JobConfig:
    """A search of a few seconds: 8 candidates, then 2 generations of 6."""
    return JobConfig.model_validate(
        {
            "target_length": 256,
            "output_dir": str(tmp_path),
            "data": {"search_windows": 1},
            "search": {"population": 8, "parents": 4, "mutations": 3, "crossovers": 3, "generations": 2, "seed": 5}
            | search,
        }
    )


def pool(folder, **spec) -> WorkerPool:
    settings = {"num_workers": 2, "num_cpus_per_worker": 0.5, "batch_size": 2, "restart_timeout_s": 20} | spec
    return WorkerPool(
        function_model(folder), [[0, 0]], PoolSpec(**settings), worker_class=FunctionWorker, record_failures=True
    )


def search_through(pool_: WorkerPool, config: JobConfig, run_dir: RunDir):
    try:
        return run_job(config, run_dir, pool_)[0]
    finally:
        pool_.shutdown()


def lines(run_dir: RunDir) -> list[dict]:
    return [json.loads(line) for line in run_dir.file("history.jsonl").read_text().splitlines()]


def scores(run_dir: RunDir) -> dict[str, float | None]:
    return {line["key"]: line["mean_nll"] for line in lines(run_dir)}


class PoisonEvaluator(FunctionEvaluator):
    """The in-process evaluator, with the poisoned candidates given up as the pool gives them up."""

    def as_completed(self):
        for key, score in super().as_completed():
            yield key, TaskFailure("ValueError: poisoned", 3) if is_poisoned(key[0], POISON) else score


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The uninterrupted run, in process."""
    folder = tmp_path_factory.mktemp("clean")
    run_dir = RunDir(folder)
    best = run_job(job(folder), run_dir, FunctionEvaluator())[0]
    return best, scores(run_dir)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "retried", "died", "retired"),
    [
        pytest.param("raise 3", 2, 0, 0, id="a-task-raises-once"),  # both tasks of the call sent again
        pytest.param("die 3", 0, 1, 0, id="an-actor-killed-mid-task"),  # re-queued, not retried: not their fault
        # 3 calls in a row fail, then it is replaced: their tasks are retried, at least one a call (a retry is sent
        # alone; how many of the queue a call takes, and whether a fourth call's error lands first, is up to timing)
        pytest.param("broken", 3, None, 1, id="a-worker-fails-every-task"),
    ],
)
def test_a_transient_failure_ends_as_the_uninterrupted_search(
    local_ray, tmp_path, clean, fault, retried, died, retired
):
    run_dir = RunDir(tmp_path / "run")
    workers = pool(fault_folder(tmp_path / "fault", fault))
    best = search_through(workers, job(run_dir.path), run_dir)
    clean_best, clean_scores = clean
    assert best == clean_best
    assert scores(run_dir) == clean_scores, "every candidate scored once, as if it had succeeded the first time"
    assert workers.retired == retired
    assert workers.retried == retried if fault != "broken" else workers.retried >= retried
    assert died is None or workers.failures == died


@pytest.mark.slow
def test_a_candidate_that_fails_everywhere_is_recorded_and_the_run_finishes(local_ray, tmp_path):
    folder = fault_folder(tmp_path / "fault", f"poison {POISON}")
    run_dir = RunDir(tmp_path / "run")
    config = job(run_dir.path)
    best = search_through(pool(folder, retries=1), config, run_dir)
    failed = [line for line in lines(run_dir) if line["status"] == "failed"]
    assert failed, "the seed's candidates include a poisoned one"
    assert all(is_poisoned(line["key"], POISON) for line in failed)
    assert {line["error"] for line in failed} == {"ValueError: a candidate this worker cannot score (simulated)"}
    assert all(line["mean_nll"] is None and line["nll"] == [] for line in failed)
    assert not is_poisoned(best.key, POISON)
    assert json.loads(run_dir.file("state.json").read_text())["finished"]
    reference_dir = RunDir(tmp_path / "in-process")
    assert run_job(job(reference_dir.path), reference_dir, PoisonEvaluator())[0] == best
    assert {k: v for k, v in scores(reference_dir).items()} == scores(run_dir)
    write_job_record(run_dir.path, config)
    status = run_status(run_dir)
    assert status.finished and status.best_key == best.key and status.evaluations == len(lines(run_dir))
    exported = factors_file_of_run(run_dir).provenance
    assert exported.finished and exported.best_key == best.key and exported.evaluations == status.evaluations


def test_a_failed_candidate_survives_a_resume(tmp_path):
    clean_dir, crash_dir = RunDir(tmp_path / "clean"), RunDir(tmp_path / "crash")
    clean_best = run_job(job(clean_dir.path), clean_dir, PoisonEvaluator())[0]
    with pytest.raises(RuntimeError, match="simulated coordinator crash"):
        run_job(job(crash_dir.path), crash_dir, PoisonEvaluator(fail_on_call=3))
    resumed_best = run_job(job(crash_dir.path), crash_dir, PoisonEvaluator(), resume=True)[0]
    assert resumed_best == clean_best
    assert scores(crash_dir) == scores(clean_dir)
    clean_state, resumed_state = (json.loads(d.file("state.json").read_text()) for d in (clean_dir, crash_dir))
    assert resumed_state["optimizer"] == clean_state["optimizer"]


@pytest.mark.slow
def test_without_record_failures_a_task_past_its_retries_stops_the_pool(local_ray, tmp_path):
    """Compare needs every row: there, a task that fails on every try is the pool's error, after its retries."""
    folder = fault_folder(tmp_path / "fault", "poison 1")
    workers = WorkerPool(
        function_model(folder), [[0, 0]], PoolSpec(num_workers=2, num_cpus_per_worker=0.5), worker_class=FunctionWorker
    )
    try:
        from known_problem import problem

        seed = problem().seeds[0]
        workers.submit([(("k", 0), problem().make_candidate(seed.factors))], windows=(0, 1))
        with pytest.raises(WorkerPoolError, match=r"scoring failed 3 times: ValueError: a candidate"):
            list(workers.as_completed())
        assert score_calls(folder) == 3
    finally:
        workers.shutdown()


def test_a_failed_record_needs_its_error_and_has_no_score():
    line = {"key": "k", "generation": 0, "factors": [1.0], "n_hat": 0, "attention_factor": None}
    line |= {"mean_nll": None, "perplexity": None, "nll": [], "tokens": []}
    record = HistoryRecord.model_validate(line | {"status": "failed", "error": "RuntimeError: CUDA out of memory"})
    assert record.final and record.score == math.inf
    assert HistoryRecord.model_validate_json(record.line()) == record
    with pytest.raises(ValueError, match="error: a 'failed' record needs error"):
        HistoryRecord.model_validate(line | {"status": "failed"})
    with pytest.raises(ValueError, match="error: a 'scored' record has no error"):
        HistoryRecord.model_validate(line | {"error": "x"})


def test_the_generation_line_counts_the_failed_candidates():
    from longrope.search.optimizers.searcher import GenerationEnd
    from longrope.search.run.generation_log import generation_line

    line = {"generation": 0, "factors": [1.0], "n_hat": 0, "attention_factor": None, "mean_nll": None}
    line |= {"perplexity": None, "nll": [], "tokens": [], "status": "failed", "error": "RuntimeError: OOM"}
    history = {key: HistoryRecord.model_validate(line | {"key": key}) for key in ("a", "b")}
    text = generation_line(
        GenerationEnd("generation 0/3", 0, math.inf, math.inf), history, racing=False, seconds=1.0, scored=2
    )
    assert text.startswith("generation 0/3  evaluations 2 (2 failed)  best search ppl -")


def test_workers_are_pinned_to_an_accelerator_type_only_when_one_is_named():
    assert "accelerator_type" not in actor_options(PoolSpec(), 1.0, 0.0)
    pinned = actor_options(PoolSpec(accelerator_type="H100", max_restarts=4), 0.25, 1.0)
    assert pinned == {
        "num_cpus": 0.25,
        "num_gpus": 1.0,
        "max_restarts": 4,
        "max_task_retries": 0,
        "accelerator_type": "H100",
    }


class FailsOneGradientRange(FunctionEvaluator):
    """A descent's evaluator whose `fail_at`-th backward range is given up (its other ranges come back)."""

    def __init__(self, fail_at: int, **kwargs):
        super().__init__(**kwargs)
        self.fail_at, self.backward_ranges = fail_at, 0

    def as_completed(self):
        pending, self.pending = self.pending, []
        for key, candidate, windows, gradient in pending:
            self.backward_ranges += gradient
            if gradient and self.backward_ranges == self.fail_at:
                yield key, TaskFailure("RuntimeError: CUDA out of memory", 3)
            else:
                yield key, self._score(candidate, windows, gradient)


def test_a_descent_step_with_a_failed_range_is_recorded_once_and_the_descent_goes_on(tmp_path):
    from known_problem import problem
    from search_helpers import make_coordinator

    from longrope.search.optimizers.factory import load_job_config

    settings = ["target_length=256", "data.search_windows=4", "search.seed=3", f"output_dir={tmp_path}"]
    config = load_job_config(None, [*settings, "search.optimizer=gradient", "search.gradient.steps=4"])
    run_dir = RunDir(tmp_path)
    run_dir.create(config)
    evaluator = FailsOneGradientRange(3, windows=4, wobble=0.0, workers=2)  # a step's backward: 2 ranges
    best = make_coordinator(config, run_dir, evaluator, problem(4)).run()
    records = lines(run_dir)
    failed = [line for line in records if line["status"] == "failed"]
    assert len(failed) == 1 and "gradient" not in failed[0]
    assert len({line["key"] for line in records}) == len(records), "one line per candidate"
    assert best.status == "scored" and json.loads(run_dir.file("state.json").read_text())["finished"]
