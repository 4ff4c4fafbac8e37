"""End to end on the shipped reference model with a small budget: search, export, transformers, compare."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import ray
import torch
from search_helpers import make_coordinator
from transformers import AutoModelForCausalLM

from longrope.encodings import from_hf
from longrope.search.config.factors_file import FactorsFile
from longrope.search.export.factors_export import factors_file_of_run, write_into_model
from longrope.search.job.job_context import JobContext
from longrope.search.job.jobs import run_search
from longrope.search.optimizers.factory import load_job_config
from longrope.search.reports.compare import OUTPUT_FILES, run_compare
from longrope.search.reports.intervals import paired_difference
from longrope.search.run.coordinator import SearchProblem
from longrope.search.run.run_store import RunDir, best_of
from longrope.workers import pool as pool_module
from longrope.workers.models import load_model
from longrope.workers.pool import WorkerPool
from longrope.workers.reference_recipe import reference_model_dir
from longrope.workers.scorer import Scorer

pytestmark = pytest.mark.slow

SMALL_BUDGET = [
    "target_length=1024",
    "data.search_windows=4",
    "data.test_windows=16",
    "search.seeds=[pi, ntk, yarn]",  # the paper's three, not the tuned grids: the counts are worked for them
    "search.population=8",
    "search.parents=4",
    "search.mutations=3",
    "search.crossovers=3",
    "search.generations=2",
    "search.attention_factor.mode=searched",
    "workers.num_workers=2",
    "workers.num_cpus_per_worker=0.5",
    "workers.local_num_cpus=2",
    "workers.batch_size=2",
]


@pytest.fixture(scope="module")
def reference_model_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    config = load_job_config(None, [*SMALL_BUDGET, f"output_dir={out}"])
    best = run_search(config)
    yield config, RunDir(out), best
    ray.shutdown()


def test_run_directory_is_complete(reference_model_run):
    _, run_dir, best = reference_model_run
    state = run_dir.read_state()
    assert state.finished and state.progress.generation == 3 and state.searcher is None  # the GA is replayed
    history = run_dir.read_history()
    assert len(history) == 8 + 2 * 6 and best == best_of(history)
    assert {r.seed for r in history.values()} >= {"pi", "ntk", "yarn"}
    assert all(len(r.nll) == 4 and r.tokens == [1024] * 4 for r in history.values())


def test_export_validates_and_transformers_loads_it_with_equal_logits(reference_model_run, tmp_path):
    _, run_dir, best = reference_model_run
    exported = factors_file_of_run(run_dir)
    FactorsFile.model_validate_json(exported.model_dump_json())  # the JSON validates against its model
    model_dir = shutil.copytree(reference_model_dir(), tmp_path / "model")
    write_into_model(exported, model_dir)
    assert list(model_dir.glob("config.json.*.bak")), "the original config is kept"
    config = json.loads((model_dir / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "longrope" and config["max_position_embeddings"] == 1024
    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokens = torch.from_numpy(np.random.default_rng(0).integers(0, 256, size=(1, 1025)))
    ours, rope = load_model(reference_model_dir(), device="cpu")
    candidate = from_hf(config["rope_parameters"], head_dim=32, max_position_embeddings=1024)
    (score,) = Scorer(ours, tokens, rope.method.original_inv_freq()).score([candidate])
    with torch.no_grad():
        logits = hf_model(input_ids=tokens[:, :-1]).logits[0]
        hf_nll = float(torch.nn.functional.cross_entropy(logits, tokens[0, 1:], reduction="sum"))
        from longrope.workers.rope_patch import patched_rotary

        with patched_rotary(ours, rope.method.original_inv_freq()) as patched:
            patched.set_candidates([candidate], seq_len=1024)
            our_logits = ours(input_ids=tokens[:, :-1]).logits[0]
    torch.testing.assert_close(our_logits, logits, rtol=1e-5, atol=1e-5)
    assert score.nll[0] == pytest.approx(hf_nll, rel=1e-5)
    assert candidate.attention_factor == pytest.approx(best.attention_factor)


def test_best_beats_nominal_ntk_on_the_test_split(reference_model_run, tmp_path, monkeypatch):
    config, run_dir, _ = reference_model_run
    factors_path = tmp_path / "factors.json"
    factors_path.write_text(factors_file_of_run(run_dir).model_dump_json())
    context = JobContext.resolve(config)
    pools = []

    def counted_pool(*args, **kwargs):
        pools.append(WorkerPool(*args, **kwargs))
        return pools[-1]

    monkeypatch.setattr(pool_module, "WorkerPool", counted_pool)
    result = run_compare(
        context, factors_files=[str(factors_path)], lengths=[128, 1024], out_dir=tmp_path / "cmp", log=lambda line: None
    )
    assert len(pools) == 1, "one worker pool (one model load per worker) for every length and objective"
    methods = result["methods"]
    for name in ("file:factors.json", "ntk_tuned"):  # LongRoPE blocks: vLLM applies the long factors everywhere
        transformers_row, vllm_row = methods[name], methods[f"{name} (vLLM)"]
        assert vllm_row["runtime"] == "vllm" and transformers_row["runtime"] == "transformers"
        assert vllm_row["nll_per_window"]["1024"] == transformers_row["nll_per_window"]["1024"]  # past L0: the same
        assert vllm_row["nll_per_window"]["128"] != transformers_row["nll_per_window"]["128"]  # short: long factors
    assert "yarn (vLLM)" not in methods, "methods without regimes apply the same in both runtimes"
    best, ntk = methods["file:factors.json"], methods["ntk"]
    mean, low, high = paired_difference(best["nll_per_window"]["1024"], ntk["nll_per_window"]["1024"])
    assert high < 0, (mean, low, high)
    for name in OUTPUT_FILES:
        assert (tmp_path / "cmp" / name).stat().st_size > 0
    assert set(methods) >= {"none", "pi", "ntk", "dynamic", "yarn", "llama3", "ntk_tuned"}
    for row in methods.values():
        for length in ("128", "1024"):
            cell = row["needle"][length]
            share, low, high = cell["accuracy"]
            assert cell["windows"] == config.data.test_windows and 0 <= low <= share <= high <= 1
            assert set(cell["accuracy_by_depth"]) == {"0", "0.25", "0.5", "0.75", "1"}
    assert "needle acc @ 1024" in (tmp_path / "cmp" / "compare.md").read_text()


class KillingEvaluator:
    """The real pool, with one of its Ray workers killed after the fifth result of the search."""

    def __init__(self, pool: WorkerPool):
        self.pool, self.seen = pool, 0
        self.capacity = pool.capacity

    def submit(self, candidates, windows=None):
        self.pool.submit(candidates, windows)

    def as_completed(self):
        for item in self.pool.as_completed():
            self.seen += 1
            if self.seen == 5:
                ray.kill(self.pool.workers[0].actor, no_restart=True)
            yield item


def test_killed_ray_worker_loses_no_candidate(reference_model_run, tmp_path):
    config, _, _ = reference_model_run
    config = load_job_config(None, [*SMALL_BUDGET, f"output_dir={tmp_path}", "search.seed=7"])
    context = JobContext.resolve(config)
    windows = context.windows(config.data.search_source, 1024, config.data.search_windows)
    pool = WorkerPool(context.model_spec(), windows.tokens, context.pool_spec())
    run_dir = RunDir(tmp_path)
    run_dir.create(config)
    problem = SearchProblem(context.pairs, context.scale, context.seeds(), context.longrope, windows=len(windows.names))
    coordinator = make_coordinator(config, run_dir, KillingEvaluator(pool), problem)
    try:
        coordinator.run()
    finally:
        pool.shutdown()
    lines = (tmp_path / "history.jsonl").read_text().splitlines()
    keys = [json.loads(line)["key"] for line in lines]
    assert len(keys) == len(set(keys)) == 8 + 2 * 6, "every candidate scored exactly once"
    assert pool.failures == 1 and run_dir.read_state().finished
