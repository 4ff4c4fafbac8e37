"""The worker pool on a real multi-node Ray cluster (head + 2 nodes on this machine) losing a node mid-run, and a
whole search (the known problem, no model) that loses one and ends as the uninterrupted search does."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import ray
import torch
from ray.cluster_utils import Cluster

from longrope.encodings import LongRope
from longrope.workers.models import load_model
from longrope.workers.pool import WorkerPool
from longrope.workers.scorer import Scorer
from longrope.workers.specs import ModelSpec, PoolSpec

pytestmark = pytest.mark.slow
FAST_FAILURE_DETECTION = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_failure_threshold": 2,
}


@pytest.fixture(scope="module")
def ray_utils_cluster():
    os.environ["RAY_AUTH_MODE"] = "disabled"
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "_system_config": FAST_FAILURE_DETECTION, "include_dashboard": False},
    )
    nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    yield cluster, nodes  # the pool itself connects, as a job with `workers.address` set does
    ray.shutdown()
    cluster.shutdown()


def test_removed_node_mid_run_still_returns_every_result(ray_utils_cluster, tiny_llama_dir):
    cluster, nodes = ray_utils_cluster
    windows = np.random.default_rng(1).integers(0, 96, size=(16, 129))
    candidates = [
        (
            i,
            LongRope.from_factors(
                torch.linspace(1.0, 1.0 + 0.05 * i, 16), head_dim=32, original_length=64, target_length=128
            ),
        )
        for i in range(60)
    ]
    model, rope = load_model(tiny_llama_dir, device="cpu")
    direct = Scorer(model, torch.from_numpy(windows), rope.method.original_inv_freq()).score([m for _, m in candidates])

    pool = WorkerPool(
        ModelSpec(model_dir=str(tiny_llama_dir), candidates_per_forward=1, tokens_per_forward=128),
        windows,
        PoolSpec(num_workers=2, num_cpus_per_worker=1, batch_size=1, restart_timeout_s=5, address=cluster.address),
    )
    assert ray.get_runtime_context().gcs_address == cluster.address
    placed = {info["node"] for info in pool.worker_info()}
    assert len(placed) == 2, "one worker per node"
    results = []
    for item in pool.imap(candidates):
        results.append(item)
        if len(results) == 2:
            cluster.remove_node(nodes[0], allow_graceful=False)
    assert sorted(key for key, _ in results) == list(range(60))
    for key, score in results:
        assert score.nll == pytest.approx(direct[key].nll, rel=1e-6)
    assert pool.failures == 1
    pool.shutdown()


def scores(run_dir) -> dict[str, float | None]:
    lines = run_dir.file("history.jsonl").read_text().splitlines()
    return {record["key"]: record["mean_nll"] for record in map(json.loads, lines)}


class NodeRemover:
    """The pool as the coordinator sees it, removing the node of one of its workers once `after` results are in."""

    def __init__(self, pool: WorkerPool, cluster: Cluster, after: int):
        self.pool, self.cluster, self.after, self.seen = pool, cluster, after, 0
        self.capacity, self.workers, self.submit = pool.capacity, pool.workers, pool.submit

    def as_completed(self):
        for item in self.pool.as_completed():
            self.seen += 1
            if self.seen == self.after:
                node_id = self.pool.worker_info()[0]["node"]
                node = next(n for n in self.cluster.list_all_nodes() if n.node_id == node_id)
                self.cluster.remove_node(node, allow_graceful=False)
            yield item


def test_a_search_that_loses_a_node_ends_as_the_uninterrupted_one(ray_utils_cluster, tmp_path):
    from faulty_function_workers import FunctionWorker, fault_folder, function_model
    from search_helpers import FunctionEvaluator, run_job

    from longrope.search.config.job_config import JobConfig
    from longrope.search.run.run_store import RunDir

    cluster, _ = ray_utils_cluster
    cluster.add_node(num_cpus=1)  # whatever the test before removed: a node for each worker
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()

    def job(folder):
        search = {"population": 8, "parents": 4, "mutations": 3, "crossovers": 3, "generations": 2, "seed": 5}
        return JobConfig.model_validate(
            {"target_length": 256, "output_dir": str(folder), "data": {"search_windows": 1}, "search": search}
        )

    clean_dir, run_dir = RunDir(tmp_path / "clean"), RunDir(tmp_path / "run")
    clean_best = run_job(job(clean_dir.path), clean_dir, FunctionEvaluator())[0]
    pool = WorkerPool(
        function_model(fault_folder(tmp_path / "fault", "slow 0.2")),  # its calls out when the node goes
        [[0, 0]],
        PoolSpec(num_workers=2, num_cpus_per_worker=1, batch_size=1, restart_timeout_s=5, address=cluster.address),
        worker_class=FunctionWorker,
        record_failures=True,
    )
    try:
        best = run_job(job(run_dir.path), run_dir, NodeRemover(pool, cluster, after=3))[0]
    finally:
        pool.shutdown()
    assert best == clean_best
    assert scores(run_dir) == scores(clean_dir), "every candidate scored once, with the score it has anyway"
    assert pool.failures == 1
