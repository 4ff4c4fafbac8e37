"""The suite decoder: one small Llama-shaped decoder that takes any of the suite's positional encodings.

Everything but the encoding is the reference model's architecture (transformers' `LlamaForCausalLM`: RMSNorm
before attention and MLP, SwiGLU MLP, no biases, tied embeddings), with transformers' parameter names, so
the RoPE checkpoint loads into `LlamaForCausalLM` as it is and the two forwards agree (a test checks it).
Position enters only through the suite's one interface (`longrope.encodings.interface.PositionalEncoding`):
the model calls `add_to_embeddings` once on the token embeddings, and every attention layer goes through
`reference_attention`, which calls `rotate` and `attention_bias`. Nothing positional is written here.

Where an encoding has parameters, they sit where the paper puts them: the learned table once, at the
embeddings (GPT-2's `wpe`); CoPE's position table once per attention layer (Golovneva et al. 2024, sec. 3).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.nn import functional

from longrope.encodings.absolute import LearnedAbsoluteEncoding, SinusoidalEncoding
from longrope.encodings.alibi import ALiBiEncoding
from longrope.encodings.cope import CoPEEncoding
from longrope.encodings.interface import NoPE, PositionalEncoding, RotaryEncoding, reference_attention
from longrope.encodings.rope_methods import RopeMethod
from longrope.workers.byte_tokenizer import BYTE_VOCAB_SIZE
from longrope.workers.reference_recipe import EncodingName, TrainingRecipe


class SuiteModelConfig(BaseModel):
    """A suite checkpoint's config.json: the encoding and the shape it was trained with."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    architecture: Literal["SuiteDecoder"] = "SuiteDecoder"
    encoding: EncodingName
    vocab_size: int = Field(default=BYTE_VOCAB_SIZE, gt=0)
    hidden_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    num_layers: int = Field(gt=0)
    num_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    train_length: int = Field(gt=0)
    rope_theta: float = Field(default=10000.0, gt=1.0)
    rms_norm_eps: float = Field(default=1e-6, gt=0.0)
    # token embeddings are multiplied by this before position is added: sqrt(d_model) for sinusoidal, as in
    # Vaswani et al. 2017 (sec. 3.4), so that unit-amplitude sinusoids do not drown the tokens; 1 otherwise
    embedding_scale: float = Field(default=1.0, gt=0.0)

    def plain_rope(self) -> RopeMethod:
        """The RoPE the `rope` model was trained with: plain RoPE at its training length."""
        return RopeMethod(head_dim=self.head_dim, max_position_embeddings=self.train_length, rope_theta=self.rope_theta)

    def llama_config(self, rope_parameters: dict | None = None, max_position_embeddings: int | None = None):
        """This shape as transformers' `LlamaConfig`: the reference model's config, and the config a suite `rope`
        checkpoint loads into `LlamaForCausalLM` with (the same parameter names). Tied embeddings, no special
        tokens (the vocabulary is bytes). `rope_parameters` defaults to the plain RoPE it was trained with and
        `max_position_embeddings` to the training length."""
        from transformers import LlamaConfig  # transformers only where a Llama is built: the suite decoder needs none

        return LlamaConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_heads,
            head_dim=self.head_dim,
            max_position_embeddings=max_position_embeddings or self.train_length,
            rope_parameters=rope_parameters or {"rope_type": "default", "rope_theta": self.rope_theta},
            rms_norm_eps=self.rms_norm_eps,
            tie_word_embeddings=True,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        )


def suite_config(encoding: EncodingName, recipe: TrainingRecipe) -> SuiteModelConfig:
    """The one mapping from a training recipe to a model shape: every encoding's checkpoint and the reference model
    (`llama_config` of the `rope` shape) are built from it, so everything but the encoding (and sinusoidal's
    embedding scale) is shared."""
    return SuiteModelConfig(
        encoding=encoding,
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_layers=recipe.num_layers,
        num_heads=recipe.num_heads,
        head_dim=recipe.head_dim,
        train_length=recipe.train_length,
        rope_theta=recipe.rope_theta,
        embedding_scale=math.sqrt(recipe.hidden_size) if encoding == "sinusoidal" else 1.0,
    )


def embedding_encoding(config: SuiteModelConfig) -> PositionalEncoding:
    """The model-level encoding, whose `add_to_embeddings` the model calls: additive encodings live here."""
    if config.encoding == "sinusoidal":
        return SinusoidalEncoding(config.hidden_size)
    if config.encoding == "learned":
        return LearnedAbsoluteEncoding(config.train_length, config.hidden_size)
    return NoPE()


def attention_encoding(config: SuiteModelConfig) -> PositionalEncoding:
    """One attention layer's encoding, whose `rotate` and `attention_bias` its attention calls."""
    if config.encoding == "rope":
        return RotaryEncoding(config.plain_rope())
    if config.encoding == "alibi":
        return ALiBiEncoding(config.num_heads)
    if config.encoding == "cope":
        # the authors' default table size: the training block plus one (facebookresearch/RAM, projects/cope)
        return CoPEEncoding(config.train_length + 1, config.head_dim)
    return NoPE()


class SuiteAttention(nn.Module):
    def __init__(self, config: SuiteModelConfig):
        super().__init__()
        inner = config.num_heads * config.head_dim
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, inner, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, inner, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, inner, bias=False)
        self.o_proj = nn.Linear(inner, config.hidden_size, bias=False)
        self.position = attention_encoding(config)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        out = reference_attention(q, k, v, self.position, positions)
        return self.o_proj(out.transpose(1, 2).flatten(2))


class SuiteMLP(nn.Module):
    """Llama's SwiGLU: `down(silu(gate(x)) * up(x))`."""

    def __init__(self, config: SuiteModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(functional.silu(self.gate_proj(x)) * self.up_proj(x))


class SuiteLayer(nn.Module):
    def __init__(self, config: SuiteModelConfig):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = SuiteAttention(config)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = SuiteMLP(config)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions)
        return x + self.mlp(self.post_attention_layernorm(x))


class SuiteBody(nn.Module):
    """`model.*` in transformers' names: embeddings, layers, final norm."""

    def __init__(self, config: SuiteModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position = embedding_encoding(config)
        self.layers = nn.ModuleList(SuiteLayer(config) for _ in range(config.num_layers))
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class SuiteDecoder(nn.Module):
    """Token ids [B, T] to next-token logits [B, T, vocab], the LM head tied to the token embeddings."""

    def __init__(self, config: SuiteModelConfig):
        super().__init__()
        self.config = config
        self.model = SuiteBody(config)
        self.apply(_init_weights)

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        tokens = self.model.embed_tokens(input_ids) * self.config.embedding_scale
        x = self.model.position.add_to_embeddings(tokens, positions)
        for layer in self.model.layers:
            x = layer(x, positions)
        return self.model.norm(x)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return functional.linear(self.hidden_states(input_ids), self.model.embed_tokens.weight)

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        """Mean next-token NLL of every token after the first (what `LlamaForCausalLM(labels=...)` computes)."""
        logits = self(tokens[:, :-1])
        return functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())

    def attention_encodings(self) -> list[PositionalEncoding]:
        return [layer.self_attn.position for layer in self.model.layers]

    def use_rope_method(self, method: RopeMethod) -> None:
        """Read the `rope` model with another RoPE-family method (PI, NTK, YaRN, LongRoPE, ...)."""
        if self.config.encoding != "rope":
            raise ValueError(f"encoding: only the rope model takes a RoPE method, this one is {self.config.encoding}")
        for encoding in self.attention_encodings():
            encoding.method = method


def _init_weights(module: nn.Module) -> None:
    """transformers' Llama initialisation: normal(0, 0.02) for linear and embedding weights."""
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)
