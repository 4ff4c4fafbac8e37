"""The scorer's gradient in the LongRoPE factors and attention factor (`Scorer.score_with_gradient`): against a
central finite difference of the scorer's own NLL in float64 on the shipped reference model, per-window gradients
of stacked windows against each window alone, its NLL against `score`'s, the differentiable cos/sin against the
no-grad tables, frozen weights, checkpointing counted in saved tensors, and window chunks on a real Ray pool
summing to the whole."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from conftest import save_tiny_llama
from transformers.models.llama.modeling_llama import LlamaRMSNorm

import longrope.workers.scorer as scorer_module
from longrope.encodings import LongRope, RopeMethod
from longrope.workers.documents import read_source
from longrope.workers.models import load_model
from longrope.workers.pool import ModelSpec, PoolSpec, WorkerPool
from longrope.workers.reference_recipe import reference_model_dir
from longrope.workers.rope_patch import CandidateRotaryEmbedding
from longrope.workers.scorer import Scorer
from longrope.workers.tokenization import TextTokenizer
from longrope.workers.windows import load_windows

ORIGINAL, TARGET, PAIRS = 128, 256, 16  # the reference model (configs/demo.yaml: model.path reference)


def reference_windows(count: int, length: int = TARGET) -> torch.Tensor:
    """Real text (the demo's search split), so the factors matter as they do in a search."""
    windows = load_windows(read_source("corpus:search"), TextTokenizer("bytes"), length=length + 1, count=count, seed=0)
    return torch.from_numpy(windows.tokens)


def candidate(
    top: float = 3.0, attention: float | None = 1.1, n_hat: int = 0, target: int = TARGET, original: int = ORIGINAL
) -> LongRope:
    return LongRope.from_factors(
        torch.linspace(1.0, top, PAIRS),
        head_dim=32,
        original_length=original,
        target_length=target,
        attention_factor=attention,
        n_hat=n_hat,
    )


def moved(method: LongRope, index: int, delta: float) -> LongRope:
    """`method` with long_factor[index] (or, at index PAIRS, the attention factor) moved by `delta`."""
    factors, attention = list(method.long_factor), method.attention_factor
    if index < PAIRS:
        factors[index] += delta
    else:
        attention += delta
    return method.model_copy(update={"long_factor": factors, "attention_factor_override": attention})


def float64_rms_norm(self, hidden: torch.Tensor) -> torch.Tensor:
    """transformers' LlamaRMSNorm without its float32 round trip (modeling_llama.py casts to float32 and back)."""
    variance = hidden.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden * torch.rsqrt(variance + self.variance_epsilon))


def test_gradient_equals_a_central_finite_difference_in_float64(monkeypatch):
    """The reference model cast to float64 (its RMSNorm too, which transformers runs in float32 whatever the
    dtype: float32 noise in the NLL, ~1e-5 nats here, would swamp a finite difference), 2 windows of 256 tokens.
    With float64 the central difference's error is its truncation, O(h^2): at h = 1e-5 it agreed with the gradient
    to under 1e-6 relative on every pair, and to 3e-9 absolute on the lowest-frequency pair, whose gradient is
    ~1e-4 (h 1e-3 and 1e-4 converged to it as h^2)."""
    monkeypatch.setattr(LlamaRMSNorm, "forward", float64_rms_norm)
    model, rope = load_model(reference_model_dir(), device="cpu")
    scorer = Scorer(model.double(), reference_windows(2), rope.method.original_inv_freq())
    method, step = candidate(), 1e-5
    score = scorer.score_with_gradient(method)
    assert len(score.gradient) == 2 and all(len(row) == PAIRS + 1 for row in score.gradient)
    for index in (0, 5, 10, 15, PAIRS):  # high, middle and low frequency pairs, and the attention factor
        plus = scorer.score_with_gradient(moved(method, index, step)).nll
        minus = scorer.score_with_gradient(moved(method, index, -step)).nll
        central = [(up - down) / (2 * step) for up, down in zip(plus, minus, strict=True)]
        assert [row[index] for row in score.gradient] == pytest.approx(central, rel=1e-5, abs=1e-7), index


def test_stacked_windows_get_each_its_own_gradient(reference_model):
    """Three windows in one forward (one leaf row each) against each window scored alone (a forward each), and a
    window range against those windows of the whole."""
    model, rope = reference_model
    original_inv_freq = rope.method.original_inv_freq()
    windows = reference_windows(3)
    stacked = Scorer(model, windows, original_inv_freq, tokens_per_forward=4096)
    alone = Scorer(model, windows, original_inv_freq, tokens_per_forward=1, loss_chunk_tokens=37)
    assert stacked.windows_per_forward(1) == 3 and alone.windows_per_forward(1) == 1
    together, single = stacked.score_with_gradient(candidate()), alone.score_with_gradient(candidate())
    assert together.nll == pytest.approx(single.nll, rel=1e-6)
    for row, expected in zip(together.gradient, single.gradient, strict=True):
        np.testing.assert_allclose(row, expected, rtol=1e-4, atol=1e-4 * max(map(abs, expected)))
    assert not np.allclose(together.gradient[0], together.gradient[1], rtol=0.1), "windows differ"
    part = stacked.score_with_gradient(candidate(), windows=(1, 3))
    assert part.tokens == (TARGET, TARGET) and part.nll == pytest.approx(together.nll[1:], rel=1e-6)
    np.testing.assert_allclose(part.gradient, together.gradient[1:], rtol=1e-4, atol=1e-3)


def test_nll_equals_plain_scoring(reference_model):
    """score_with_gradient's NLL, tokens and misses (with a loss mask) are what `score` gives the same method."""
    model, rope = reference_model
    original_inv_freq = rope.method.original_inv_freq()
    windows = reference_windows(2)
    plain = Scorer(model, windows, original_inv_freq)
    for method in (candidate(), candidate(top=6.0, attention=None)):
        (expected,) = plain.score([method])
        got = plain.score_with_gradient(method)
        assert got.tokens == expected.tokens and got.misses is None and expected.gradient is None
        assert got.nll == pytest.approx(expected.nll, rel=1e-6)
    mask = torch.zeros(2, TARGET, dtype=torch.bool)
    mask[:, 200:] = True  # the tail only: a masked-out chunk is skipped on both paths
    masked = Scorer(model, windows, original_inv_freq, loss_mask=mask, loss_chunk_tokens=64)
    (expected,) = masked.score([candidate()])
    got = masked.score_with_gradient(candidate())
    assert got.tokens == expected.tokens == (56, 56) and got.misses == expected.misses
    assert got.nll == pytest.approx(expected.nll, rel=1e-6)
    assert any(abs(value) > 0 for value in got.gradient[0])


def test_differentiable_tables_equal_the_no_grad_tables():
    """The rope patch's rows set from tensors (the gradient's leaves) give bit-identical cos/sin to the rows set
    from the method, and the tables carry autograd back to the leaves."""
    method = candidate()
    inv_freq = RopeMethod(head_dim=32, max_position_embeddings=ORIGINAL).original_inv_freq()
    plain, differentiable = CandidateRotaryEmbedding(inv_freq), CandidateRotaryEmbedding(inv_freq)
    plain.set_candidates([method], seq_len=TARGET, rows_each=2)
    leaf = torch.tensor([*method.long_factor, method.attention_factor]).repeat(2, 1).requires_grad_()
    differentiable.set_long_factors(method, leaf[:, :PAIRS], leaf[:, PAIRS])
    positions, x = torch.arange(TARGET)[None], torch.zeros(1)
    cos, sin = differentiable(x, positions)
    with torch.no_grad():
        expected_cos, expected_sin = plain(x, positions)
    assert torch.equal(cos, expected_cos) and torch.equal(sin, expected_sin)
    (cos.sum() + sin.sum()).backward()
    assert leaf.grad is not None and bool(leaf.grad.abs().sum() > 0)


def test_weights_get_no_gradient_and_plain_scores_are_unchanged(reference_model):
    model, rope = reference_model
    original_inv_freq = rope.method.original_inv_freq()
    scorer = Scorer(model, reference_windows(2), original_inv_freq)
    flags = [param.requires_grad for param in model.parameters()]
    before = scorer.score([candidate(), candidate(top=6.0)])
    scorer.score_with_gradient(candidate())
    assert all(param.grad is None for param in model.parameters())
    assert [param.requires_grad for param in model.parameters()] == flags, "requires_grad restored"
    assert all("forward" not in layer.__dict__ for layer in model.model.layers), "checkpointing removed"
    assert scorer.score([candidate(), candidate(top=6.0)]) == before
    with torch.inference_mode():  # a caller's inference mode does not stop the gradient
        assert scorer.score_with_gradient(candidate()).gradient is not None


def test_what_cannot_be_differentiated_is_refused(reference_model):
    model, rope = reference_model
    original_inv_freq = rope.method.original_inv_freq()
    scorer = Scorer(model, reference_windows(1), original_inv_freq)
    with pytest.raises(ValueError, match="needs a LongRope method"):
        scorer.score_with_gradient(RopeMethod(head_dim=32, max_position_embeddings=TARGET))
    with pytest.raises(ValueError, match="n_hat = 8 is not differentiable"):
        scorer.score_with_gradient(candidate(n_hat=8))
    with pytest.raises(ValueError, match="short regime"):
        scorer.score_with_gradient(candidate(original=TARGET, target=2 * TARGET))
    wide = LongRope.from_factors([1.0] * 32, head_dim=64, original_length=ORIGINAL, target_length=TARGET)
    with pytest.raises(ValueError, match="the method has 32 pairs, the model 16"):
        scorer.score_with_gradient(wide)


def saved_elements(model_dir, *, checkpointing: bool, monkeypatch) -> int:
    """Elements of every tensor autograd saves for the backward outside checkpointed regions (the saved-tensor
    hooks of a non-reentrant checkpoint replace these inside them), for one gradient call: 2 windows x 512."""
    model, rope = load_model(model_dir, device="cpu")
    scorer = Scorer(model, torch.randint(0, 96, (2, 513)), rope.method.original_inv_freq(), tokens_per_forward=4096)
    if not checkpointing:
        monkeypatch.setattr(scorer_module, "checkpointed_layers", lambda model, offload_to: contextlib.nullcontext())
    sizes = []

    def pack(tensor):
        sizes.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        scorer.score_with_gradient(candidate(top=4.0, target=512, original=64))
    monkeypatch.undo()
    return sum(sizes)


def test_checkpointing_keeps_one_hidden_state_per_layer(tmp_path, monkeypatch):
    """Random small Llamas (d 128) of 2 and 4 layers, 2 rows x 512 positions: with checkpointing, each layer
    more adds exactly one hidden state (2 x 512 x 128 elements: the layer's input) to what the backward holds;
    without it, each layer's own activations (q, k, v, attention, MLP: over ten hidden states' worth)."""
    dirs = {layers: save_tiny_llama(tmp_path / str(layers), layers=layers) for layers in (2, 4)}
    hidden = 2 * 512 * 128
    with_checkpoints = {n: saved_elements(d, checkpointing=True, monkeypatch=monkeypatch) for n, d in dirs.items()}
    without = {n: saved_elements(d, checkpointing=False, monkeypatch=monkeypatch) for n, d in dirs.items()}
    assert (with_checkpoints[4] - with_checkpoints[2]) / 2 == hidden
    assert (without[4] - without[2]) / 2 > 10 * hidden


@pytest.mark.slow
def test_window_chunks_on_a_ray_pool_sum_to_the_whole(local_ray, tiny_llama_dir):
    """Data-parallel gradients: windows (0, 2) and (2, 4) as separate tasks to 2 workers sum to the gradient of
    (0, 4) in one task, and a plain task in the same call is scored as before (no gradient)."""
    windows = np.random.default_rng(0).integers(0, 96, size=(4, 129))
    spec = ModelSpec(model_dir=str(tiny_llama_dir), device="cpu", tokens_per_forward=256)
    pool = WorkerPool(spec, windows, PoolSpec(num_workers=2, num_cpus_per_worker=0.5, batch_size=2))
    method = candidate(target=128, original=64)
    try:
        pool.submit([("left", method)], windows=(0, 2), gradient=True)
        pool.submit([("right", method)], windows=(2, 4), gradient=True)
        pool.submit([("whole", method)], windows=(0, 4), gradient=True)
        pool.submit([("plain", method)], windows=(0, 4))
        results = dict(pool.as_completed())
    finally:
        pool.shutdown()
    assert sorted(results) == ["left", "plain", "right", "whole"]
    whole = np.sum(results["whole"].gradient, axis=0)
    chunks = np.sum(results["left"].gradient, axis=0) + np.sum(results["right"].gradient, axis=0)
    np.testing.assert_allclose(chunks, whole, rtol=1e-4, atol=1e-4 * np.abs(whole).max())
    assert results["plain"].gradient is None
    assert results["plain"].nll == pytest.approx(results["whole"].nll, rel=1e-6)
