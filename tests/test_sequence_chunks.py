"""Each layer's MLP run in chunks of positions gives the unchunked model's per-window NLL and gradient.

The reference is the same scorer with chunking off (`mlp_chunk_tokens=None`): the model's own MLP over the whole
sequence at once. Float32 tiny models of four families (a dense Llama, Mixtral's mixture of experts, Gemma 3's local
and global layers, Phi's parallel attention and MLP), chunk sizes that divide the 256 positions and ones that do
not, one window a forward and two. The chunking is seen to happen (the MLP is called on chunks, never on the whole
sequence), so the equality cannot hold by chunking nothing.
"""

from __future__ import annotations

import pytest
import torch
from family_models import TARGET, VOCAB, rising_candidate, save_family_model

from longrope.workers.families import decoder_of
from longrope.workers.models import load_model
from longrope.workers.scorer import Scorer

FAMILIES = ["llama", "mixtral", "gemma3 (local and global)", "phi (partial rotary)"]
CHUNKS = [64, 100, 255]  # 256 positions: 4 whole chunks; 3 chunks, the last of 56; 2 chunks, the last of 1


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request, tmp_path_factory):
    model_dir = save_family_model(request.param, tmp_path_factory.mktemp("chunks") / "model")
    model, rope = load_model(model_dir, device="cpu", dtype="float32")
    windows = torch.randint(0, VOCAB, (2, TARGET + 1), generator=torch.Generator().manual_seed(4))
    return model, rope, windows


def scorer(family_model, chunk: int | None, windows_per_forward: int) -> Scorer:
    model, rope, windows = family_model
    tokens = windows_per_forward * TARGET
    return Scorer(model, windows, rope.method.original_inv_freq(), tokens_per_forward=tokens, mlp_chunk_tokens=chunk)


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("windows_per_forward", [1, 2])
def test_chunked_mlps_give_the_unchunked_nll(family_model, chunk, windows_per_forward):
    candidate = rising_candidate(family_model[1])
    whole = scorer(family_model, None, windows_per_forward).score([candidate])[0]
    (chunked,) = scorer(family_model, chunk * windows_per_forward, windows_per_forward).score([candidate])
    torch.testing.assert_close(torch.tensor(chunked.nll), torch.tensor(whole.nll), rtol=1e-6, atol=0)


@pytest.mark.parametrize("chunk", [64, 100])
def test_chunked_mlps_give_the_unchunked_gradient(family_model, chunk):
    candidate = rising_candidate(family_model[1])
    whole = scorer(family_model, None, 2).score_with_gradient(candidate)
    chunked = scorer(family_model, 2 * chunk, 2).score_with_gradient(candidate)
    torch.testing.assert_close(torch.tensor(chunked.nll), torch.tensor(whole.nll), rtol=1e-6, atol=0)
    gradient, reference = torch.tensor(chunked.gradient), torch.tensor(whole.gradient)
    assert reference.abs().max() > 1e-2, "the candidate moves the NLL, so the gradient can differ"
    torch.testing.assert_close(gradient, reference, rtol=1e-4, atol=1e-6 * float(reference.abs().max()))


def test_the_mlp_is_called_on_chunks_and_restored_after(family_model):
    """Every layer's MLP sees chunks of at most 64 positions per row in the forward and the backward's recompute,
    never the whole 256; after scoring the MLP is its own again."""
    model, _, _ = family_model
    seen: list[int] = []
    mlps = [layer.mlp for layer in decoder_of(model).layers]
    originals = [mlp.forward for mlp in mlps]

    def spy(forward):
        def run(hidden):
            seen.append(hidden.shape[1])
            return forward(hidden)

        return run

    for mlp, forward in zip(mlps, originals, strict=True):
        mlp.forward = spy(forward)
    try:
        candidate = rising_candidate(family_model[1])
        scorer(family_model, 128, 2).score_with_gradient(candidate)  # 2 rows: 64 positions a chunk
    finally:
        for mlp in mlps:
            del mlp.forward
    # per layer: 4 chunks in the forward, 4 in the layer's recompute, then the chunks' own recomputes (PyTorch's
    # non-reentrant checkpoint stops a recompute once it has what the backward needs, so not always all 4)
    assert max(seen) == 64 and len(seen) > 4 * len(mlps)
    assert all("forward" not in mlp.__dict__ for mlp in mlps)
