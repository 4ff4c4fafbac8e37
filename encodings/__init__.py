"""The positional-encoding suite: the one place in longrope-search where positional-encoding math lives.

Pure torch, no I/O, no Ray, and no import of ours outside this folder. RoPE variants reduce to `inv_freq` +
`attention_factor` (`rope_methods/`, one file per method family, read from transformers configs by `hf_params`);
the other families (sinusoidal, learned, ALiBi, CoPE, NoPE, multi-axis RoPE) plug into a decoder block through
the uniform `PositionalEncoding` interface (`interface`).
"""

from longrope.encodings.critical_dim import critical_dim, pair_periods
from longrope.encodings.errors import EncodingConfigError, PositionOutOfRangeError
from longrope.encodings.hf_params import from_hf, from_hf_config
from longrope.encodings.rope_methods import (
    ROPE_METHODS,
    DynamicNtkRope,
    LinearRope,
    Llama3Rope,
    LongRope,
    NtkRope,
    RopeMethod,
    YarnRope,
)
from longrope.encodings.rotary import apply_rotary, default_inv_freq, rotary_cos_sin

__all__ = [
    "ROPE_METHODS",
    "DynamicNtkRope",
    "EncodingConfigError",
    "LinearRope",
    "Llama3Rope",
    "LongRope",
    "NtkRope",
    "PositionOutOfRangeError",
    "RopeMethod",
    "YarnRope",
    "apply_rotary",
    "critical_dim",
    "default_inv_freq",
    "from_hf",
    "from_hf_config",
    "pair_periods",
    "rotary_cos_sin",
]
