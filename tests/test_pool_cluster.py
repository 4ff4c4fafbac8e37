"""The worker pool on a real multi-node Ray cluster (head + 2 nodes on this machine) losing a node mid-run."""

from __future__ import annotations

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
