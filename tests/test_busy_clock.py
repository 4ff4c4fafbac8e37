"""The workers' busy share (`BusyClock`, heartbeat.json's `busy`, `longrope status`), worked by hand."""

from __future__ import annotations

import json

import pytest
from search_helpers import FunctionEvaluator, make_coordinator

from longrope.search.optimizers.factory import load_job_config
from longrope.search.reports.status import format_status, run_status
from longrope.search.run.heartbeat import HEARTBEAT
from longrope.search.run.run_store import RunDir
from longrope.workers.busy_clock import BusyClock, BusyTime


def test_busy_intervals_worked_by_hand():
    """2 workers. Worker 0 holds a call from t=10 to t=15, worker 1 from t=12 on: at t=20 that is 5 + 8 = 13
    worker-seconds of 2 x (20 - 10) = 20, a share of 0.65. Nothing counts before the first call."""
    clock = BusyClock(2)
    clock.update(set(), 3.0)
    assert clock.reading(5.0) == BusyTime(workers=2, busy_s=0.0, wall_s=0.0) and clock.reading(5.0).fraction is None
    clock.update({0}, 10.0)
    clock.update({0, 1}, 12.0)
    clock.update({1}, 15.0)
    reading = clock.reading(20.0)
    assert (reading.busy_s, reading.wall_s) == (13.0, 10.0)
    assert reading.fraction == pytest.approx(0.65)
    clock.update(set(), 21.0)
    assert clock.reading(30.0).busy_s == 14.0  # worker 1's interval closed at 21


def test_status_prints_the_busy_share_heartbeat_json_holds(tmp_path):
    """A run's heartbeat.json with the workers' busy time (as the coordinator writes it from the pool's clock):
    `status` gives the share, and `--json` the same number; a run without one says nothing of it."""
    config = load_job_config(
        None, ["target_length=256", "data.search_windows=1", "search.generations=1", f"output_dir={tmp_path}"]
    )
    store = RunDir(tmp_path)
    store.create(config)
    make_coordinator(config, store, FunctionEvaluator()).run()
    assert run_status(store).workers_busy is None and "workers busy" not in format_status(run_status(store))
    beat = json.loads(store.file(HEARTBEAT).read_text())
    beat["busy"] = {"workers": 8, "busy_s": 5520.0, "wall_s": 750.0}  # 5520 / (8 x 750) = 0.92
    store.file(HEARTBEAT).write_text(json.dumps(beat))
    status = run_status(store)
    assert (status.workers, status.workers_busy) == (8, pytest.approx(0.92))
    assert "workers busy 92% of the time (8 workers, in the run's latest process)" in format_status(status)
