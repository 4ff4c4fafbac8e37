"""The worker pool on a real local Ray: results equal direct scoring, killed workers lose nothing, and a worker
that fails on purpose (tests/scripted_workers.py) is probed back, reported or given up as it should be."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import ray
import torch
from scripted_workers import ScriptedWorker, SleepingWorker, calls_made, write_script
from search_helpers import unloadable_safetensors

from longrope.encodings import LongRope
from longrope.workers.errors import ModelLoadError, WorkerPoolError
from longrope.workers.models import load_model
from longrope.workers.placement import actor_resources, placeable_workers, workers_to_start
from longrope.workers.pool import WorkerPool
from longrope.workers.ray_start import check_reachable
from longrope.workers.scorer import Scorer
from longrope.workers.specs import ModelSpec, PoolSpec

pytestmark = pytest.mark.slow

ORIGINAL, TARGET, PAIRS = 64, 128, 16


@pytest.fixture(scope="module")
def windows():
    return np.random.default_rng(0).integers(0, 96, size=(2, TARGET + 1))


def candidates(count: int) -> list[tuple[int, LongRope]]:
    return [
        (
            i,
            LongRope.from_factors(
                torch.linspace(1.0, 1.0 + 0.25 * i, PAIRS), head_dim=32, original_length=ORIGINAL, target_length=TARGET
            ),
        )
        for i in range(count)
    ]


@pytest.fixture(scope="module")
def direct_scores(tiny_llama_dir, windows):
    model, rope = load_model(tiny_llama_dir, device="cpu")
    scorer = Scorer(model, torch.from_numpy(windows), rope.method.original_inv_freq(), candidates_per_forward=2)
    return dict(zip(range(12), scorer.score([m for _, m in candidates(12)]), strict=True))


def model_spec(model_dir) -> ModelSpec:
    return ModelSpec(model_dir=str(model_dir), device="auto", candidates_per_forward=2, tokens_per_forward=TARGET)


def assert_same_results(results, direct_scores, count):
    keys = [key for key, _ in results]
    assert sorted(keys) == list(range(count)), "every candidate exactly once"
    for key, score in results:
        assert score.nll == pytest.approx(direct_scores[key].nll, rel=1e-6)


def test_pool_results_equal_direct_scoring(local_ray, tiny_llama_dir, windows, direct_scores):
    pool = WorkerPool(
        model_spec(tiny_llama_dir), windows, PoolSpec(num_workers=2, num_cpus_per_worker=0.5, batch_size=2)
    )
    try:
        assert len(pool.worker_info()) == 2
        assert_same_results(list(pool.imap(candidates(12))), direct_scores, 12)
        assert_same_results(list(pool.imap(candidates(5))), direct_scores, 5)  # a pool is reusable
        # racing's window groups: tasks on different window ranges share a call (batches [0, 2] and [1, 3])
        four = dict(candidates(4))
        for key in (0, 2, 1, 3):
            pool.submit([(key, four[key])], windows=(0, 1) if key % 2 == 0 else (1, 2))
        parts = dict(pool.as_completed())
        for key, score in parts.items():
            window = key % 2
            assert score.nll == pytest.approx(direct_scores[key].nll[window : window + 1], rel=1e-6)
            assert score.tokens == (TARGET,)
        assert pool.capacity == 2 * 2 * 2, "usable workers x calls per worker x batch size"
    finally:
        pool.shutdown()


def test_fake_gpu_workers_fall_back_to_cpu(local_ray, tiny_llama_dir, windows, direct_scores):
    pool = WorkerPool(
        model_spec(tiny_llama_dir),
        windows,
        PoolSpec(num_workers=2, num_gpus_per_worker=1, num_cpus_per_worker=0.25, batch_size=3),
    )
    try:
        assert [info["device"] for info in pool.worker_info()] == ["cpu", "cpu"]
        assert_same_results(list(pool.imap(candidates(6))), direct_scores, 6)
    finally:
        pool.shutdown()


@pytest.mark.parametrize("restart", [True, False], ids=["restarted", "gone-for-good"])
def test_killed_worker_mid_run_loses_nothing(local_ray, tiny_llama_dir, windows, direct_scores, restart):
    pool = WorkerPool(
        model_spec(tiny_llama_dir),
        windows,
        PoolSpec(num_workers=2, num_cpus_per_worker=0.5, batch_size=1, restart_timeout_s=5),
    )
    try:
        pool.worker_info()
        results = []
        for item in pool.imap(candidates(12)):
            results.append(item)
            if len(results) == 2:
                ray.kill(pool.workers[0].actor, no_restart=not restart)
        assert pool.failures >= 1
        assert_same_results(results, direct_scores, 12)
    finally:
        pool.shutdown()


def test_no_worker_left_is_one_clear_error(local_ray, tiny_llama_dir, windows):
    """A worker past its restarts is given up as soon as a call to it fails again, not after the restart
    timeout (an hour here: a pool that waited for it would hold this test for that long)."""
    pool = WorkerPool(
        model_spec(tiny_llama_dir),
        windows,
        PoolSpec(num_workers=1, num_cpus_per_worker=0.5, batch_size=1, restart_timeout_s=3600),
    )
    pool.worker_info()
    ray.kill(pool.workers[0].actor, no_restart=True)
    with pytest.raises(WorkerPoolError, match=r"no worker left \(1 worker failures\); \d+ candidates were not scored"):
        list(pool.imap(candidates(4)))


def test_actor_resources_fit_the_cluster():
    gpu_spec = PoolSpec(num_workers=2, num_gpus_per_worker=0.5, num_cpus_per_worker=1)
    assert actor_resources(gpu_spec, {"CPU": 16, "GPU": 8}) == (1, 0.5)
    with pytest.warns(UserWarning, match="has no GPU; scoring on CPUs"):
        assert actor_resources(gpu_spec, {"CPU": 2}) == (1, 0.0)
    with pytest.raises(WorkerPoolError, match=r"workers\.num_cpus_per_worker = 4: the Ray cluster has only 2 CPUs"):
        actor_resources(PoolSpec(num_cpus_per_worker=4), {"CPU": 2})
    with pytest.raises(WorkerPoolError, match=r"workers\.num_gpus_per_worker = 2: the Ray cluster has only 1 GPUs"):
        actor_resources(PoolSpec(num_gpus_per_worker=2), {"CPU": 2, "GPU": 1})


def test_a_worker_that_cannot_load_reports_its_own_error(local_ray, tiny_llama_dir, windows, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((tiny_llama_dir / "config.json").read_text())
    (broken / "model.safetensors").write_bytes(unloadable_safetensors())
    spec = PoolSpec(num_workers=1, num_cpus_per_worker=0.5, restart_timeout_s=3600)
    pool = WorkerPool(model_spec(broken), windows, spec)
    try:
        with pytest.raises(ModelLoadError, match=r"could not load the model: SafetensorError: .*header"):
            list(pool.imap(candidates(2)))
        assert pool.failures == 0, "the actor is alive and says why; it was not restarted into the same failure"
    finally:
        pool.shutdown()


def test_more_workers_than_the_cluster_can_place_start_what_fits(local_ray, tiny_llama_dir, windows, direct_scores):
    with pytest.warns(UserWarning, match=r"num_workers = 3: the Ray cluster can place only 2 workers of 1 CPUs"):
        pool = WorkerPool(model_spec(tiny_llama_dir), windows, PoolSpec(num_workers=3, num_cpus_per_worker=1))
    try:
        assert len(pool.workers) == 2
        assert_same_results(list(pool.imap(candidates(12))), direct_scores, 12)
    finally:
        pool.shutdown()


def test_placeable_workers_counts_node_by_node():
    nodes = [
        {"Alive": True, "Resources": {"CPU": 3.0, "GPU": 2.0}},  # 3 CPU workers, or 1 of (2 CPU, 1 GPU)
        {"Alive": True, "Resources": {"CPU": 1.0}},  # a 2-CPU worker does not fit here
        {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}},  # dead nodes hold nothing
    ]
    assert placeable_workers(1, 0, nodes) == 4
    assert placeable_workers(2, 0, nodes) == 1
    assert placeable_workers(2, 1, nodes) == 1
    assert placeable_workers(0.5, 0.5, nodes) == 4  # GPUs bound the first node: 2 / 0.5
    with pytest.raises(WorkerPoolError, match=r"no node of the Ray cluster can place a worker of 4 CPUs and 0 GPUs"):
        workers_to_start(PoolSpec(num_workers=1, num_cpus_per_worker=4), 4, 0, nodes)


def test_an_unreachable_address_fails_at_once():
    with pytest.raises(WorkerPoolError, match=r"workers.address = 'ray://127.0.0.1:1': nothing answers there"):
        check_reachable("ray://127.0.0.1:1", timeout_s=5)


def test_the_embedded_ray_never_joins_another_cluster(tmp_path):
    """RAY_ADDRESS pointing at a dead cluster is what a plain ray.init() would join; embedded starts its own."""
    script = (
        "from longrope.workers.ray_start import ensure_ray\n"
        "from longrope.workers.specs import PoolSpec\n"
        "import ray\n"
        "ensure_ray(PoolSpec(local_num_cpus=1))\n"
        "print('nodes', len(ray.nodes()))\n"
    )
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:1", "RAY_AUTH_MODE": "disabled"}
    result = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0 and "nodes 1" in result.stdout, result.stderr[-2000:]


# ---- failure handling: a real local Ray, a worker that fails on purpose (tests/scripted_workers.py) ----


def scripted_pool(folder, spec: PoolSpec) -> WorkerPool:
    return WorkerPool(ModelSpec(model_dir=str(folder)), np.zeros((1, 2)), spec, worker_class=ScriptedWorker)


def test_a_transient_failure_with_a_call_still_in_flight_is_probed_back(local_ray, tmp_path):
    """Two calls in flight; the first fails as ActorUnavailableError (the actor is only unreachable), the second
    succeeds. The worker must be probed back into service (a `ready` call), not left neither usable nor dead (a
    busy loop), and the lost candidate scored by the call after the probe."""
    folder = write_script(tmp_path / "worker", "unavailable", "ok")
    pool = scripted_pool(folder, PoolSpec(num_workers=1, batch_size=1, calls_per_worker=2, restart_timeout_s=3600))
    try:
        results = {key: score.nll for key, score in pool.imap([("a", None), ("b", None)])}
        assert results == {"a": (3.0,), "b": (2.0,)}, "b by the second call, a again by the third"
        assert calls_made(folder) == ["score", "score", "ready", "score"]
        assert pool.workers[0].usable and pool.workers[0].deaths == 0 and pool.failures == 1
    finally:
        pool.shutdown()


def test_workers_that_never_answer_are_reported_once(local_ray, tmp_path):
    """A worker that has not answered after start_warning_s (here 0: its first call takes 2 s) is said once, not
    on every wait: Ray holds actors pending without a word when a shared cluster's resources are taken."""
    folder = write_script(tmp_path / "worker", "sleep 2")
    pool = scripted_pool(folder, PoolSpec(num_workers=1, batch_size=1, start_warning_s=0.0))
    try:
        with pytest.warns(UserWarning, match=r"no worker has answered after \d+ s \(1 started\)") as caught:
            assert {key: score.nll for key, score in pool.imap([("a", None)])} == {"a": (1.0,)}
        assert len(caught) == 1, "said once, not on every wait"
    finally:
        pool.shutdown()


def test_a_death_after_a_transient_failure_still_counts(local_ray, tmp_path):
    """Unavailable first, then dead: the death is counted, so a worker past max_restarts is given up at once
    (restart_timeout_s is an hour) and never called again."""
    folder = write_script(tmp_path / "worker", "unavailable", "die")
    spec = PoolSpec(num_workers=1, batch_size=1, calls_per_worker=2, max_restarts=0, restart_timeout_s=3600)
    pool = scripted_pool(folder, spec)
    try:
        with pytest.raises(WorkerPoolError, match=r"no worker left \(1 worker failures\); 2 candidates were not"):
            list(pool.imap([("a", None), ("b", None)]))
        assert pool.workers[0].deaths == 1 and pool.workers[0].dead
        assert calls_made(folder) == ["score", "score"]
    finally:
        pool.shutdown()


def test_a_short_queue_is_shared_over_the_workers_and_their_busy_time_counted(local_ray, tmp_path):
    """4 tasks, 4 idle workers, batches of up to 4: one call each (not one full batch on one worker), so 4 pids
    score them. Each worker holds its call at least the 0.3 s it sleeps, so the busy clock reads at least 4 x 0.3
    worker-seconds, and no more than 4 workers x its wall time."""
    (tmp_path / "sleep").write_text("0.3")
    spec = PoolSpec(num_workers=4, num_cpus_per_worker=0.25, batch_size=4, calls_per_worker=2)
    pool = WorkerPool(ModelSpec(model_dir=str(tmp_path)), np.zeros((1, 2)), spec, worker_class=SleepingWorker)
    try:
        pids = {info["pid"] for info in pool.worker_info()}
        scored = dict(pool.imap([(key, None) for key in "abcd"]))
        assert len(pids) == 4 and {score.nll[0] for score in scored.values()} == {float(pid) for pid in pids}
        busy = pool.busy.reading(time.monotonic())
        assert busy.workers == 4 and 4 * 0.3 <= busy.busy_s <= 4 * busy.wall_s
    finally:
        pool.shutdown()
