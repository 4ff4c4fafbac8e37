"""bench/gpu_scale.py cannot rot: its dry run (tiny shapes, the CPU) runs every part end to end as the GPU run does,
a length that runs out of memory is recorded and the parts after it still run, a gradient that runs out of memory
falls back to the next length, a part past the budget is skipped with its reason, and the split model scores and
differentiates as the unsplit one."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from longrope.search.cost.architecture import Architecture
from longrope.search.cost.flops import forward_flops
from longrope.search.cost.memory import ForwardShape, worker_memory
from longrope.workers.scorer import Scorer

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def gpu_scale(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    return importlib.import_module("gpu_scale")


def dry_run(gpu_scale, tmp_path, *extra: str) -> dict:
    return gpu_scale.main(["--dry-run", "--out", str(tmp_path / "gpu_scale.json"), *extra])


def test_dry_run_measures_every_part(gpu_scale, tmp_path):
    result = dry_run(gpu_scale, tmp_path)
    assert result["dry_run"] is True and result["layers"] == 2 and "torch" in result["machine"]
    assert (tmp_path / "gpu_scale.json").is_file()
    arch = Architecture.from_hf_config(gpu_scale.sdpa_llama(gpu_scale.DRY["shape"], 2).to_dict())
    weights = worker_memory(arch, ForwardShape(tokens=1, rows=1), "bfloat16", "sdpa").weights
    assert result["build"]["estimate_weights_gib"] == pytest.approx(weights / 2**30) and weights > 0
    rows = result["forward"]
    assert [row["tokens"] for row in rows] == [64, 128, 256]  # saved in increasing length, whatever the run order
    assert [row["layers_run"] for row in rows] == [2, 2, 1] and all(row["layers_resident"] == 2 for row in rows)
    for row in rows:
        run_arch = arch.model_copy(update={"num_layers": row["layers_run"]})
        assert row["flops"] == pytest.approx(forward_flops(run_arch, row["tokens"]).total)
        assert row["tflops"] == pytest.approx(row["flops"] / row["seconds"] / 1e12)
        everything = forward_flops(arch, row["tokens"]).total
        assert row["seconds_all_layers_at_this_rate"] == pytest.approx(row["seconds"] * everything / row["flops"])
        estimate = worker_memory(arch, ForwardShape(tokens=row["tokens"], rows=1), "bfloat16", "sdpa").peak / 2**30
        assert row["estimate_peak_gib"] == pytest.approx(estimate) and estimate > 0
        assert row["estimate_with_headroom_gib"] > row["estimate_peak_gib"] + 0.99  # the CUDA context's GiB
        assert row["peak_memory_gib"] is None and row["memory_ratio"] is None  # no allocator counter on a CPU
        assert 0 < row["mean_nll"] < 2 * torch.log(torch.tensor(256.0)).item()
    assert rows[2]["seconds_all_layers_at_this_rate"] > rows[2]["seconds"]  # 1 of 2 layers ran
    (gradient,) = result["gradient"]
    assert gradient["tokens"] == 128 and gradient["checkpoints"] == "device" and gradient["seconds"] > 0
    assert gradient["flops"] > 3 * forward_flops(arch, 128).total and gradient["estimate_peak_gib"] > 0
    assert gradient["estimate_checkpoints_on_host"] is False
    split = result["split"]
    assert split["devices"] == ["cpu", "cpu"] and split["layers_per_half"] == [2, 2]
    assert split["split_mean_nll"] == pytest.approx(split["plain_mean_nll"], abs=1e-5)
    assert split["max_abs_nll_difference"] <= 1e-5 and split["max_abs_gradient_difference"] <= 1e-5
    assert split["agrees"] is True and len(split["plain_mean_nll"]) == 2


def test_an_out_of_memory_length_is_recorded_and_the_later_parts_still_run(gpu_scale, tmp_path, monkeypatch):
    """256 tokens (the first of the longer lengths run) and a gradient at 128 raise CUDA's out-of-memory error: both
    are recorded, the gradient falls back to 64, and the forward at 128 and the split run after them."""
    score, gradient = Scorer.score, Scorer.score_with_gradient

    def failing(real, length):
        def call(self, *args, **kwargs):
            if self.context_length == length:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")
            return real(self, *args, **kwargs)

        return call

    monkeypatch.setattr(Scorer, "score", failing(score, 256))
    monkeypatch.setattr(Scorer, "score_with_gradient", failing(gradient, 128))
    result = dry_run(gpu_scale, tmp_path, "--split-tokens", "64")  # the split's gradient clear of the failing 128
    short, middle, failed = result["forward"]
    assert failed["tokens"] == 256 and failed["error"] == "out of memory" and "seconds" not in failed
    assert failed["message"].startswith("CUDA out of memory") and failed["estimate_peak_gib"] > 0
    assert short["seconds"] > 0 and middle["seconds"] > 0  # 128 ran after 256 failed
    first, fallback = result["gradient"]
    assert (first["tokens"], first["error"]) == (128, "out of memory")
    assert fallback["tokens"] == 64 and fallback["seconds"] > 0 and "error" not in fallback
    assert result["split"]["tokens"] == 64 and result["split"]["agrees"] is True


def test_a_part_past_the_budget_is_skipped_with_its_reason(gpu_scale, tmp_path):
    result = dry_run(gpu_scale, tmp_path, "--budget-s", "0")
    assert result["build"]["estimate_weights_gib"] > 0
    parts = [*result["forward"], *result["gradient"], result["split"]]
    assert [row["tokens"] for row in result["gradient"]] == [128, 64]  # each gradient length tried in turn
    for part in parts:
        assert "seconds" not in part and "left" in part["skipped"] and "assumed 396 TFLOP/s" in part["skipped"]
