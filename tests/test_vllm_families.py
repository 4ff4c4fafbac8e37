"""vLLM applies each family's LongRoPE export as the scorer scores it, or the difference is asserted here.

tests/test_families.py checks, for every family the scorer accepts, that the scorer's NLL equals transformers' forward
with the export applied. This module checks the same exports against vLLM 0.33.0's own rotary code, built as vLLM
builds it for that model:
- the family's tiny model (tests/family_models.py) gets the candidate tests/test_families.py scores (`rising_candidate`:
  long factors 1 to 4, attention factor 1.1, for both runtimes) exported into its config.json, as
  `longrope export --into` writes it (`exported_model`);
- vLLM's engine config is read from that directory (tests/vllm_engine.py `engine_config`), and vLLM's own model class
  for the architecture (its registry, vllm/model_executor/models/registry.py) is built on the CPU until every decoder
  layer has its rotary module. So the arguments of each `get_rope(...)` call are the ones the family's vLLM file
  passes: the head size it computes, `is_neox_style` (False in commandr.py for Cohere), the partial rotary factor
  (read from `rope_parameters`, StableLM), Gemma 3's `config.rope_parameters[layer_type]` per layer (gemma3.py),
  Granite's per-layer `rope_theta` (granite.py). Nothing of those files is copied here;
- each module's forward is run on every unit vector of a head (`applied_rotation`), giving the whole linear map it
  applies to a query and a key: the angles, the mscale, which dims pair and the dims it leaves alone;
- the scorer's side is its own rotary module (workers/rope_patch.py, `patched_rotary` on the loaded model) with the
  candidate set, its cos/sin rotated by the family's transformers `apply_rotary_pos_emb` (the function that model's
  attention calls with them) over the rotary dims, the rest of the head passed through as Phi's and StableLM's
  attention do. That is what a query and a key get when the scorer scores the candidate.
Both are float32 and agree within `COS_SIN_TOLERANCE` (1e-5, the bound `longrope verify` holds cos/sin to). Measured
here: at most 1.2e-6 at base 1e4 and 4.2e-6 at base 1e6 (Mixtral, Gemma 3's global layers) over 256 positions, 0 for
Gemma 3's local layers. vLLM's tables are bit for bit the scorer's formula on the factors as exported; the export
states the candidate as factors computed back from its float32 frequencies (`factors_file_for`), a last bit away from
the candidate's own, and the angle multiplies that by the position. The candidate moves the rotation by about 2 (more
than 1000 times the tolerance is asserted), so a family vLLM rotates otherwise cannot pass.

Lengths: at the target length (a scored window) both apply the long factors. A LongRoPE engine with max_model_len past
the original length applies them to shorter prompts too, where transformers switches to the short ones
(`LongRope.vllm_regime`; tests/test_runtimes.py holds that regime for every export shape), so a prompt of the original
length is compared with the scorer set to `vllm_regime()`.

Two parts of a vLLM model class are not built on the CPU, and neither takes part in RoPE: `Attention` (the kernel
layer, for which vLLM's CUDA wheel on a CPU torch finds no backend) and the MoE families' expert blocks (fused-MoE
kernels and an expert-parallel group). Each layer builds them after its rotary module, from no RoPE argument;
placeholders stand in.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from family_models import FAMILY_CONFIGS, ORIGINAL, TARGET, exported_model, rising_candidate, save_family_model
from torch import nn
from vllm_engine import applied_rotation, building_in, engine_config, max_diff, require_vllm

from longrope.search.export.verify import COS_SIN_TOLERANCE
from longrope.workers.families import family_of
from longrope.workers.models import load_model
from longrope.workers.rope_patch import patched_rotary

pytestmark = pytest.mark.vllm

# vLLM's own model class builds vLLM's rotary code for the export, and it applies what the scorer scores
IN_VLLM = [
    "llama",
    "llama (llama3 scaling)",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "qwen2_moe",
    "qwen3_moe",
    "phi3",
    "phi3 (longrope)",
    "stablelm",
    "gemma",
    "gemma2 (softcaps)",
    "gemma3 (local and global)",
    "granite (multipliers)",
]
# vLLM's model class builds no rotary module for the export: the error an engine for the exported model stops with
REFUSED = {"cohere (interleaved, logit_scale)": "`Phi3LongRoPEScaledRotaryEmbedding` only supports neox_style."}
# no model file of vLLM's own in 0.33.0: its registry runs the architecture with transformers' modeling code
TRANSFORMERS_BACKEND = ["phi (partial rotary)", "gpt_neox (rotary_pct)", "olmo2"]
# vLLM's default max_model_len for a LongRoPE config is its top-level `original_max_position_embeddings` where it has
# one (vllm/config/model.py, `_get_and_verify_max_len`): Phi3Config writes one and the export keeps it, as
# transformers reads it. The other families' default is max_position_embeddings, the target.
DEFAULT_ENGINE_LENGTH = {"phi3": ORIGINAL, "phi3 (longrope)": ORIGINAL}
# the rotation moved by the candidate, relative to the model's own RoPE, at least this many tolerances
MOVED = 1000


class NotBuilt(nn.Module):
    """Stands in for a part of a vLLM model class that cannot be built on a CPU torch and has no part in RoPE."""

    def __init__(self, *args, **kwargs):
        super().__init__()


# vLLM's attention kernel layer and the MoE families' expert blocks (mixtral.py, qwen2_moe.py, qwen3_moe.py)
NOT_BUILT = ("Attention", "MixtralMoE", "Qwen2MoeSparseMoeBlock", "Qwen3MoeSparseMoeBlock")


class EveryLayerBuilt(Exception):
    """Raised by the recording `get_rope` once every decoder layer has its rotary module: the build stops there, before
    the parts after the layers (the MoE families' expert bookkeeping reads the expert blocks not built here)."""


@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    """vLLM's tensor-parallel world of one process on the CPU (gloo, a file rendezvous), which a model class's
    parallel linear layers ask for their shard as they are built; torn down after the module."""
    require_vllm()
    from vllm.distributed import parallel_state

    folder = tmp_path_factory.mktemp("vllm-world")
    with building_in(engine_config(save_family_model("llama", folder / "model"))):
        parallel_state.init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"file://{folder / 'rendezvous'}",
            backend="gloo",
        )
        parallel_state.initialize_model_parallel(1, 1)
    yield
    parallel_state.destroy_model_parallel()
    parallel_state.destroy_distributed_environment()


def vllm_rotary_modules(model_dir: Path, max_model_len: int | None = None) -> tuple[list[tuple[str | None, Any]], int]:
    """([(layer type, rotary module)] for each decoder layer as vLLM's model class for the architecture builds it,
    the engine's max_model_len). `get_rope` is recorded in every vLLM model file that imports it (a class may build
    its attention from another file's: Mistral's and Phi-3's from llama.py)."""
    from vllm.model_executor.layers import rotary_embedding
    from vllm.model_executor.models.registry import ModelRegistry

    engine = engine_config(model_dir, max_model_len)
    model_config = engine.model_config
    model_class, _ = ModelRegistry.resolve_model_cls(model_config.architectures, model_config=model_config)
    hf_config = model_config.hf_config
    built = []

    def recording_get_rope(*args, **kwargs):
        built.append(rotary_embedding.get_rope(*args, **kwargs))
        if len(built) == hf_config.num_hidden_layers:
            raise EveryLayerBuilt
        return built[-1]

    with pytest.MonkeyPatch.context() as patch, building_in(engine):
        for name, module in list(sys.modules.items()):
            if not name.startswith("vllm.model_executor.models.") or module is None:
                continue
            if hasattr(module, "get_rope"):
                patch.setattr(module, "get_rope", recording_get_rope)
            for part in NOT_BUILT:
                if hasattr(module, part):
                    patch.setattr(module, part, NotBuilt)
        with contextlib.suppress(EveryLayerBuilt):
            model_class(vllm_config=engine, prefix="")
    assert len(built) == hf_config.num_hidden_layers, f"{model_class.__name__} built {len(built)} rotary modules"
    layer_types = getattr(hf_config, "layer_types", None) or [None] * len(built)
    return list(zip(layer_types, built, strict=True)), model_config.max_model_len


def scorer_rotation(model, rotary, head_dim: int, length: int, layer_type: str | None = None):
    """What a query head and a key head get at positions 0..length-1 when the scorer scores the candidates set on
    `rotary`, in `applied_rotation`'s form: the scorer's cos/sin for that layer type (Gemma 3's local layers get the
    model's own module's) rotated by the family's transformers `apply_rotary_pos_emb` (rotate_half; Cohere's
    interleaved pairs) over the first cos.shape[-1] dims, the rest passed through."""
    modeling = sys.modules[type(model).__module__]  # transformers/models/<family>/modeling_<family>.py
    probe = torch.eye(head_dim).expand(length, head_dim, head_dim).transpose(0, 1)[None]  # [1, head h, t, e_h]
    with torch.no_grad():
        cos, sin = rotary(torch.zeros(1), torch.arange(length)[None], layer_type)
        rotated = cos.shape[-1]
        query, key = modeling.apply_rotary_pos_emb(probe[..., :rotated], probe[..., :rotated], cos, sin)
    return tuple(torch.cat((part, probe[..., rotated:]), dim=-1)[0].transpose(0, 1) for part in (query, key))


def exported_family(family: str, folder: Path):
    """(the family's model, its ModelRope, the candidate, the model directory with the candidate exported)."""
    model_dir = save_family_model(family, folder / "model")
    model, rope = load_model(model_dir, device="cpu", dtype="float32")
    candidate = rising_candidate(rope)
    return model, rope, candidate, exported_model(model_dir, candidate, rope.original_length, folder / "exported")


def test_every_accepted_family_has_a_vllm_case():
    """A family added to tests/family_models.py (and so to the scorer's accepted ones) needs its vLLM case here."""
    cases = [*IN_VLLM, *REFUSED, *TRANSFORMERS_BACKEND]
    assert sorted(cases) == sorted(FAMILY_CONFIGS) and len(set(cases)) == len(cases)


@pytest.mark.parametrize("family", IN_VLLM)
def test_vllm_applies_the_export_as_the_scorer_scores_it(family, process_group, tmp_path):
    """Every layer of vLLM's model class for the family rotates queries and keys as the scorer does for the candidate:
    at the target length, and at the original length in vLLM's fixed long regime. Gemma 3's local layers keep their
    own base and no scaling in both (gemma3.py reads `config.rope_parameters[layer_type]`). Phi-3's engine starts at
    the original length unless `--max-model-len` says more, and there applies the short factors as transformers does
    up to that length; with `--max-model-len` = the target it applies the export as the others do."""
    model, rope, candidate, exported = exported_family(family, tmp_path)
    searched_type = family_of(model.config.to_dict()).searched_layer_type
    default_layers, default_length = vllm_rotary_modules(exported)
    assert default_length == DEFAULT_ENGINE_LENGTH.get(family, TARGET)
    layers, engine_length = vllm_rotary_modules(exported, max_model_len=TARGET)
    assert engine_length == TARGET

    def check(modules, length: int, method) -> None:
        rotary.set_candidates([method], seq_len=length)
        for index, (layer_type, module) in enumerate(modules):
            ours = scorer_rotation(model, rotary, rope.head_dim, length, layer_type)
            diff = max_diff(applied_rotation(module, length), ours)
            assert diff < COS_SIN_TOLERANCE, f"layer {index} ({layer_type}), {length} positions: max |diff| {diff:.1e}"

    def rotation(method, layer_type: str | None = searched_type):
        rotary.set_candidates([method], seq_len=TARGET)
        return scorer_rotation(model, rotary, rope.head_dim, TARGET, layer_type)

    with patched_rotary(model, rope.method.original_inv_freq()) as rotary:
        check(layers, TARGET, candidate)
        check(layers, ORIGINAL, candidate.vllm_regime())
        if default_length == ORIGINAL:
            check(default_layers, ORIGINAL, candidate)
        moved = max_diff(rotation(candidate), rotation(rope.method))
        assert moved > MOVED * COS_SIN_TOLERANCE, f"the candidate moves the rotation by only {moved:.1e}"
        if searched_type is not None:  # a local layer given the export's block would fail the comparison above
            local = {layer_type for layer_type, _ in layers} - {searched_type}
            assert local
            for layer_type in local:
                assert max_diff(rotation(candidate, layer_type), rotation(candidate)) > MOVED * COS_SIN_TOLERANCE


@pytest.mark.parametrize("family", list(REFUSED))
def test_vllm_builds_no_longrope_for_an_interleaved_family(family, process_group, tmp_path):
    """Cohere's attention in vLLM (vllm/model_executor/models/commandr.py, `CohereAttention`) calls `get_rope` with
    `is_neox_style=False`, its interleaved pairs; vLLM's only LongRoPE class
    (vllm/model_executor/layers/rotary_embedding/phi3_long_rope_scaled_rope.py) raises for any layout but neox. So an
    engine for a Cohere model with a `longrope` block stops while building the model: vLLM 0.33.0 cannot serve the
    export at all. Without the export vLLM rotates Cohere's queries and keys as the scorer does for the model's own
    RoPE: the layout is right, LongRoPE is what is missing."""
    model, rope, candidate, exported = exported_family(family, tmp_path)
    with pytest.raises(ValueError, match=re.escape(REFUSED[family])):
        vllm_rotary_modules(exported, max_model_len=TARGET)
    layers, length = vllm_rotary_modules(tmp_path / "model")
    assert length == ORIGINAL
    with patched_rotary(model, rope.method.original_inv_freq()) as rotary:
        rotary.set_candidates([rope.method], seq_len=length)
        for layer_type, module in layers:
            assert not module.is_neox_style
            ours = scorer_rotation(model, rotary, rope.head_dim, length, layer_type)
            assert max_diff(applied_rotation(module, length), ours) < COS_SIN_TOLERANCE
        plain = scorer_rotation(model, rotary, rope.head_dim, length)
        rotary.set_candidates([candidate], seq_len=length)
        moved = max_diff(scorer_rotation(model, rotary, rope.head_dim, length), plain)
        assert moved > MOVED * COS_SIN_TOLERANCE, "what the export changes, and vLLM cannot apply"


@pytest.mark.parametrize("family", TRANSFORMERS_BACKEND)
def test_vllm_runs_the_family_with_transformers_own_code(family, tmp_path):
    """vLLM 0.33.0 has no model file of its own for the family (no vllm/model_executor/models/<model_type>.py); its
    registry (vllm/model_executor/models/registry.py, `_TRANSFORMERS_SUPPORTED_MODELS`) runs the architecture with
    its Transformers backend (vllm/model_executor/models/transformers/), which builds transformers' model and passes
    vLLM's positions to it as `position_ids` (base.py, `forward`). The RoPE applied is then transformers' own rotary
    module's, which tests/test_families.py checks the scorer against; vLLM's rotary code is not used. That module picks
    LongRoPE's factors per forward from the largest position it is given, and one vLLM forward is one scheduler step
    (several requests, or one chunk of a long prompt), so which factors a prompt's tokens get depends on how vLLM
    schedules it (docs/models.md); no vLLM forward runs here."""
    require_vllm()
    import vllm
    from vllm.model_executor.models import registry

    _, _, _, exported = exported_family(family, tmp_path)
    model_config = engine_config(exported).model_config
    (architecture,) = model_config.architectures
    model_class, _ = registry.ModelRegistry.resolve_model_cls([architecture], model_config=model_config)
    assert (model_class.__module__, model_class.__name__) == (
        "vllm.model_executor.models.transformers",
        "TransformersForCausalLM",
    )
    assert registry._TRANSFORMERS_SUPPORTED_MODELS[architecture] == ("transformers", "TransformersForCausalLM")
    assert architecture not in registry._TEXT_GENERATION_MODELS
    models = Path(vllm.__file__).parent / "model_executor" / "models"
    assert not (models / f"{model_config.hf_config.model_type}.py").exists()
    assert "position_ids=positions" in inspect.getsource(model_class.forward)
