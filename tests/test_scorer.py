"""The rope patch and the scorer against transformers itself, and batched against one-at-a-time."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from conftest import save_tiny_llama
from transformers import AutoModelForCausalLM

from longrope.encodings import LongRope, from_hf_config
from longrope.workers.errors import ModelLoadError
from longrope.workers.models import load_model
from longrope.workers.rope_patch import patched_rotary
from longrope.workers.scorer import Scorer, chunked_loss

ORIGINAL = 64
TARGET = 256
PAIRS = 16


def rope_blocks() -> dict[str, dict]:
    long_factor = torch.linspace(1.0, 5.0, PAIRS).tolist()
    return {
        "linear": {"rope_type": "linear", "factor": 4.0},
        "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL},
        "llama3": {
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": ORIGINAL,
        },
        "longrope": {
            "rope_type": "longrope",
            "long_factor": long_factor,
            "short_factor": [1.0] * PAIRS,
            "original_max_position_embeddings": ORIGINAL,
            "factor": 4.0,
        },
        "longrope_attention": {
            "rope_type": "longrope",
            "long_factor": long_factor,
            "short_factor": [1.0] * PAIRS,
            "original_max_position_embeddings": ORIGINAL,
            "attention_factor": 1.4,
        },
    }


def with_rope(model_dir, tmp_path, block: dict) -> tuple:
    """The same checkpoint, its config.json carrying `block` as rope_parameters (what a user's export does)."""
    target = tmp_path / "scaled"
    shutil.copytree(model_dir, target)
    config = json.loads((target / "config.json").read_text())
    config.update(rope_parameters={"rope_theta": 10000.0, **block}, max_position_embeddings=TARGET)
    (target / "config.json").write_text(json.dumps(config))
    return target, config


@pytest.mark.parametrize("name", sorted(rope_blocks()))
def test_patched_logits_equal_transformers_loading_that_rope(name, tiny_llama_dir, tmp_path, generator):
    scaled_dir, config = with_rope(tiny_llama_dir, tmp_path, rope_blocks()[name])
    reference = AutoModelForCausalLM.from_pretrained(scaled_dir, dtype=torch.float32).eval()
    model, rope = load_model(tiny_llama_dir, device="cpu")
    candidate = from_hf_config(config)
    tokens = torch.randint(0, 96, (1, 200), generator=generator)
    with torch.no_grad():
        expected = reference(input_ids=tokens).logits
        with patched_rotary(model, rope.method.original_inv_freq()) as patched:
            patched.set_candidates([candidate], seq_len=200)
            logits = model(input_ids=tokens).logits
    assert not torch.allclose(logits, model(input_ids=tokens).logits, atol=1e-3), "the candidate must change logits"
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


def test_patch_is_restored(tiny_llama_dir):
    model, rope = load_model(tiny_llama_dir, device="cpu")
    original = model.model.rotary_emb
    with patched_rotary(model, rope.method.original_inv_freq()):
        assert model.model.rotary_emb is not original
    assert model.model.rotary_emb is original


def test_chunked_loss_equals_full_logits_cross_entropy(generator):
    """The scorer's loss (`chunked_loss`, a few positions' logits at a time) against the whole [B, T, vocab] logits
    at once: the summed NLL per row, with no mask and with one (only the masked-in positions count), and the argmax
    misses within the mask, for chunks of one position, of uneven size, and of the whole row."""
    hidden = torch.randn(3, 50, 16, generator=generator)
    head = torch.nn.Linear(16, 40, bias=False)
    targets = torch.randint(0, 40, (3, 50), generator=generator)
    mask = torch.rand(3, 50, generator=generator) < 0.3
    mask[1] = False  # a row with nothing to count
    logits = head(hidden)
    per_position = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none").double()
    wrong = logits.argmax(dim=-1) != targets
    for chunk in (1, 7, 64, 10_000):
        nll, _ = chunked_loss(hidden, targets, head, chunk_tokens=chunk)
        torch.testing.assert_close(nll, per_position.sum(1), rtol=1e-6, atol=1e-6)
        masked, misses = chunked_loss(hidden, targets, head, chunk_tokens=chunk, loss_mask=mask)
        torch.testing.assert_close(masked, (per_position * mask).sum(1), rtol=1e-6, atol=1e-6)
        assert misses.tolist() == (wrong & mask).sum(1).tolist() and misses[1] == 0 and masked[1] == 0


def candidates(rope) -> list[LongRope]:
    return [
        LongRope.from_factors(
            torch.linspace(1.0, top, PAIRS),
            head_dim=32,
            original_length=ORIGINAL,
            target_length=TARGET,
            attention_factor=attention,
            n_hat=n_hat,
        )
        for top, attention, n_hat in ((1.0, 1.0, 0), (4.0, None, 0), (5.0, 1.2, 8), (3.0, None, 0), (6.0, 1.1, 0))
    ]


def test_batched_scoring_equals_one_at_a_time(tiny_llama_dir, generator):
    model, rope = load_model(tiny_llama_dir, device="cpu")
    windows = torch.randint(0, 96, (3, TARGET + 1), generator=generator)
    batched = Scorer(model, windows, rope.method.original_inv_freq(), candidates_per_forward=4, tokens_per_forward=4096)
    assert batched.windows_per_forward(4) == 3, "short windows are stacked into one forward"
    single = Scorer(
        model,
        windows,
        rope.method.original_inv_freq(),
        candidates_per_forward=1,
        tokens_per_forward=1,
        loss_chunk_tokens=37,
    )
    together, alone = batched.score(candidates(rope)), single.score(candidates(rope))
    for a, b in zip(together, alone, strict=True):
        assert a.tokens == b.tokens == (TARGET,) * 3
        assert a.nll == pytest.approx(b.nll, rel=1e-5)
    assert len({round(s.mean_nll, 4) for s in together}) == len(together), "candidates must score differently"
    # a window range (what racing scores group by group) equals those windows of the full score
    for begin, end in ((0, 1), (1, 3), (2, 3)):
        for part, full in zip(batched.score(candidates(rope), windows=(begin, end)), together, strict=True):
            assert part.tokens == (TARGET,) * (end - begin)
            assert part.nll == pytest.approx(full.nll[begin:end], rel=1e-5)
    for bad in ((0, 0), (2, 4), (-1, 1)):
        with pytest.raises(ValueError, match=r"windows: expected 0 <= start < stop <= 3"):
            batched.score(candidates(rope), windows=bad)


def test_scores_equal_transformers_loss(tiny_llama_dir, tmp_path, generator):
    """The scorer's NLL for a candidate equals transformers' own loss with that rope_parameters in config."""
    block = rope_blocks()["longrope_attention"]
    scaled_dir, config = with_rope(tiny_llama_dir, tmp_path, block)
    reference = AutoModelForCausalLM.from_pretrained(scaled_dir, dtype=torch.float32).eval()
    windows = torch.randint(0, 96, (2, TARGET + 1), generator=generator)
    model, rope = load_model(tiny_llama_dir, device="cpu")
    (score,) = Scorer(model, windows, rope.method.original_inv_freq()).score([from_hf_config(config)])
    with torch.no_grad():
        # a window of n + 1 tokens: transformers reads the first n and predicts tokens 1..n
        expected_nll = [
            float(F.cross_entropy(reference(input_ids=w[None, :-1]).logits[0], w[1:], reduction="sum")) for w in windows
        ]
    assert score.nll == pytest.approx(expected_nll, rel=1e-5)


def test_bad_model_directories_are_refused(tmp_path, tiny_llama_dir):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match=r"has no config\.json"):
        load_model(tmp_path / "empty")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="is not valid JSON"):
        load_model(broken)
    mrope = tmp_path / "mrope"
    shutil.copytree(tiny_llama_dir, mrope)
    config = json.loads((mrope / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 6, 6]}
    (mrope / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="mrope_section"):
        load_model(mrope)
    with pytest.raises(ModelLoadError, match="flash-attn is not installed"):
        load_model(tiny_llama_dir, attn_implementation="flash_attention_2")


def test_reference_like_checkpoint_round_trip(tmp_path):
    """A checkpoint saved with a longrope config loads, and its ModelRope reports the original length."""
    path = save_tiny_llama(
        tmp_path / "m",
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 1e4,
            "long_factor": [2.0] * PAIRS,
            "short_factor": [1.0] * PAIRS,
            "original_max_position_embeddings": 32,
        },
        max_position_embeddings=128,
    )
    _, rope = load_model(path, device="cpu")
    assert rope.original_length == 32 and rope.rotary_dim == 32


def test_config_overrides_change_the_loaded_model(tiny_llama_dir):
    model, _ = load_model(tiny_llama_dir, device="cpu", config_overrides={"rms_norm_eps": 0.25})
    assert model.config.rms_norm_eps == 0.25


def test_scoring_keeps_no_key_value_cache(tiny_llama_dir, generator):
    """A forward that fills a cache keeps every layer's keys and values alive to its end (the memory `longrope
    estimate` would otherwise have to count L times); the scorer's forwards return none."""
    model, rope = load_model(tiny_llama_dir, device="cpu")
    caches = []
    model.model.register_forward_hook(lambda module, args, output: caches.append(output.past_key_values))
    windows = torch.randint(0, 96, (2, 33), generator=generator)
    Scorer(model, windows, rope.method.original_inv_freq()).score([rope.method])
    assert caches and all(cache is None for cache in caches)
    with torch.no_grad():
        model.model(input_ids=windows[:, :-1])  # the model's default: a cache (the hook sees what it returns)
    assert caches[-1] is not None
