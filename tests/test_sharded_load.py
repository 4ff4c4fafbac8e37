"""The host memory of the worker's shard-by-shard load (`workers.models.sharded_load`, what a worker spread over
GPUs loads with): a random Llama saved in 9 safetensors shards, loaded in a process of its own with a device map.

On a CPU-only machine the weights' device is the host, so what the issue measures on a GPU (a load onto GPUs that
holds only about a shard in host memory at a time) cannot be measured here; what can be is the loader's host copies:
its anonymous memory (RssAnon, not the files' mapped pages, which are page cache the kernel reclaims) must stay
within the loaded weights plus one shard being converted plus the loader's own small cost, where a load through a
whole state dict holds the checkpoint and the weights at once. In float32 the weights are the files' pages
themselves (transformers maps them without a copy), so nearly nothing is anonymous; in bfloat16 each shard is
converted into the model's own tensors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from longrope.workers.random_llama import llama_config

PROBE = Path(__file__).resolve().parent / "anon_peak_probe.py"
# What the allocator may hold beyond the tiny model's measured cost: glibc and torch's CPU allocator touch a few pages
# of fresh arenas per thread; measured 0.1-0.8 MB beyond the weights over repeated runs here.
ALLOCATOR_SLACK = 8 * 2**20


def save_sharded(path: Path, hidden: int, layers: int, vocab: int) -> Path:
    shape = dict(hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers, vocab_size=vocab)
    config = llama_config(num_attention_heads=8, head_dim=hidden // 8, max_position_embeddings=256, **shape)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path, max_shard_size="20MB")
    return path


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_sharded_load_holds_the_weights_and_one_shard_at_most(tmp_path, dtype):
    """151 MB of float32 weights (d 512, 8 layers, vocabulary 4096) in 9 shards of 16.8 MB. The bound is the loaded
    weights + the largest shard + the tiny model's measured load cost + ALLOCATOR_SLACK; the whole-state-dict route
    breaks it (checkpoint + weights at once), so the measurement would see a whole copy."""
    model_dir = save_sharded(tmp_path / "model", hidden=512, layers=8, vocab=4096)
    tiny_dir = save_sharded(tmp_path / "tiny", hidden=64, layers=2, vocab=96)
    shards = [shard.stat().st_size for shard in model_dir.glob("*.safetensors")]
    assert len(shards) == 9
    run = subprocess.run([sys.executable, str(PROBE), str(model_dir), str(tiny_dir), dtype], capture_output=True,
                         text=True, timeout=300, check=True)  # fmt: skip
    result = json.loads(run.stdout.strip().splitlines()[-1])
    bound = result["weights"] + max(shards) + result["tiny"] + ALLOCATOR_SLACK
    assert result["weights"] == pytest.approx(sum(shards) / (2 if dtype == "bfloat16" else 1), rel=1e-3)
    assert result["peak"] <= bound, result
    assert result["whole"] > bound, result
