"""A gradient pass with its layer checkpoints kept on the host gives the same NLL and gradient, and holds no layer
input where the model is.

On a GPU the checkpoints (one hidden state per layer) are what grows with the window in a gradient pass: 32 GiB for
an 8B model at 128k tokens. Offloaded, each layer keeps a copy on the host and brings it back for its recompute. On
this CPU the "host" is the same device, so the test reads what matters by identity: without offloading the
autograd graph keeps every layer's input tensor alive until the backward; with it, none (only their copies), so on
a GPU their memory is freed. The reference for the numbers is the same scorer without offloading.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from family_models import TARGET, VOCAB, rising_candidate, save_family_model

from longrope.workers.families import decoder_of
from longrope.workers.models import load_model
from longrope.workers.rope_patch import patched_rotary
from longrope.workers.scorer import Scorer, gradient_mode


@pytest.fixture(scope="module", params=["llama", "gemma3 (local and global)"])
def family_model(request, tmp_path_factory):
    model_dir = save_family_model(request.param, tmp_path_factory.mktemp("offload") / "model")
    model, rope = load_model(model_dir, device="cpu", dtype="float32")
    windows = torch.randint(0, VOCAB, (2, TARGET + 1), generator=torch.Generator().manual_seed(5))
    return model, rope, windows


def test_offloaded_checkpoints_give_the_same_nll_and_gradient(family_model):
    model, rope, windows = family_model
    candidate = rising_candidate(rope)
    scores = {
        setting: Scorer(model, windows, rope.method.original_inv_freq(), checkpoints=setting).score_with_gradient(
            candidate
        )
        for setting in ("device", "host")
    }
    torch.testing.assert_close(torch.tensor(scores["host"].nll), torch.tensor(scores["device"].nll), rtol=1e-7, atol=0)
    reference = torch.tensor(scores["device"].gradient)
    assert reference.abs().max() > 1e-2, "the candidate moves the NLL"
    torch.testing.assert_close(torch.tensor(scores["host"].gradient), reference, rtol=1e-6, atol=0)


@pytest.mark.parametrize(("offload_to", "alive"), [(None, "every"), (torch.device("cpu"), "none")])
def test_the_graph_holds_the_layer_inputs_only_without_offloading(family_model, offload_to, alive):
    """After the forward, before the backward: which layer inputs the autograd graph keeps alive (the offloaded
    copies are other tensors)."""
    model, rope, windows = family_model
    inputs: list[weakref.ref] = []
    hooks = [
        layer.register_forward_pre_hook(lambda _module, args: inputs.append(weakref.ref(args[0])))
        for layer in decoder_of(model).layers
    ]
    try:
        with gradient_mode(model, offload_to), patched_rotary(model, rope.method.original_inv_freq()) as patched:
            pairs = rope.rotary_dim // 2
            candidate = rising_candidate(rope)
            leaf = torch.tensor([*candidate.long_factor, candidate.attention_factor]).repeat(1, 1).requires_grad_()
            patched.set_long_factors(candidate, leaf[:, :pairs], leaf[:, pairs])
            hidden = decoder_of(model)(input_ids=windows[:1, :-1], use_cache=False).last_hidden_state
            gc.collect()
            kept = [ref() is not None for ref in inputs]
            hidden.sum().backward()  # the graph works either way
            assert leaf.grad is not None and bool(leaf.grad.abs().sum() > 0)
    finally:
        for hook in hooks:
            hook.remove()
    assert len(kept) == len(decoder_of(model).layers)
    # past the first layer every input carries autograd (cos/sin depend on the factors), so the checkpoint must keep
    # it for the recompute: there, or only its copy; the first layer's (the embeddings) needs no gradient
    assert all(kept[1:]) if alive == "every" else not any(kept), kept
