"""bench/gpu_check.py cannot rot: its dry run (tiny shapes, the CPU) runs every part end to end as CI runs it, and
the package is importable from the checkout alone, as it must be on the GPU machine where nothing is installed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from longrope.search.cost.architecture import Architecture
from longrope.search.cost.flops import forward_flops
from longrope.workers.random_llama import llama_config

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_check.py"


@pytest.mark.slow
def test_dry_run_measures_every_part(tmp_path):
    out = tmp_path / "gpu_check.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["dry_run"] is True and result["layers"] == 2 and "ray" in result["machine"]
    peak = result["peak"]
    assert peak["tflops"] == pytest.approx(2 * peak["size"] ** 3 / peak["seconds"] / 1e12)
    shape = {k: v for k, v in result["shape"].items()}
    arch = Architecture.from_hf_config(llama_config(num_hidden_layers=2, **shape).to_dict())
    assert [row["tokens"] for row in result["forward"]] == [64, 128, 256]
    for row in result["forward"]:
        # FLOPs by hand: linear 2 T L (d (d + 2 kv h_d) + d^2 + 3 d m), attention 4 L H h_d T^2 / 2, lm_head 2 T d V
        tokens, d, kv = row["tokens"], 64, 2 * 16
        linear = 2 * tokens * 2 * (64 * (64 + 2 * kv) + 64 * 64 + 3 * 64 * 176)
        flops = linear + 4 * 2 * 4 * 16 * tokens**2 / 2 + 2 * tokens * d * 256
        assert forward_flops(arch, tokens).total == pytest.approx(flops)
        assert row["tflops"] == pytest.approx(flops / row["seconds"] / 1e12)
        assert row["mfu"] == pytest.approx(row["tflops"] / peak["tflops"])
        assert row["tokens_per_s"] == pytest.approx(tokens / row["seconds"])
        assert row["peak_memory_gib"] is None and row["estimate_memory_gib"] > 0  # no allocator counter on a CPU
    ranking = result["ranking"]
    assert set(ranking["mean_nll"]) == {"bfloat16", "float32"} and ranking["candidates"] == 2
    assert len(ranking["mean_nll"]["float32"]) == 2
    overhead = result["overhead"]
    assert overhead["estimate_assumes_seconds"] == pytest.approx((40 * 2 + 20) * 10e-6)  # 2 layers, by hand
    assert overhead["ratio"] == pytest.approx(overhead["forward_seconds"] / overhead["estimate_assumes_seconds"])
    gradient = result["gradient"]
    assert gradient["time_ratio"] == pytest.approx(gradient["gradient_seconds"] / gradient["forward_seconds"])


def test_the_package_imports_from_the_checkout_without_an_install(tmp_path):
    """With the editable install's finder taken away (the GPU machine has none), importing the script links the
    package's folders under a shim folder, and `longrope.workers.scorer` then loads from this checkout."""
    code = (
        "import sys\n"
        "sys.meta_path = [f for f in sys.meta_path if 'editable' not in repr(f)]\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "import gpu_check\n"
        "import longrope.workers.scorer as scorer\n"
        "print(scorer.__file__)\n"
    )
    env = {"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code, str(ROOT / "bench")], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    path = Path(done.stdout.strip())
    assert str(path).startswith(str(tmp_path)) and "longrope-shim" in str(path)
    assert path.resolve() == (ROOT / "workers" / "scorer.py").resolve()
