"""The RoPE family as one model: every variant is `inv_freq` + `attention_factor` (+ a per-position rule).

One small file per method family, each class overriding only how its frequencies are computed (the shape of
vLLM's `rotary_embedding/` package), and one registry, `ROPE_METHODS`, keyed by transformers' `rope_type`. Every
list of methods elsewhere (the seeds a config may name, compare's baselines and tuning grid, `longrope extrapolation`,
`longrope encodings`) is read off it and off the classes (`encodings.baselines`), so a new method is its file and its
entry below:

    base.py      plain RoPE (`default`) and the base class: fields, cos/sin, `to_hf()`
    linear.py    Position Interpolation (`linear`)
    ntk.py       NTK-aware static base change (`ntk`, exported as `default`) and Dynamic NTK (`dynamic`)
    yarn.py      YaRN (`yarn`)
    longrope.py  LongRoPE (`longrope`, legacy `su`), the method the search tunes
    llama3.py    Llama 3.1's bands (`llama3`)
    batch.py     B candidates' frequencies stacked, for one forward pass over B copies of a window

The one factory is `hf_params.from_hf`: it picks the class for a `rope_parameters` block from `ROPE_METHODS`
and validates the block into it. transformers 5.x is the reference wherever it has the method, and every
computation follows its float32 operation order, so the two agree to the last bit or close to it; each file's
docstring states its formula and where it comes from.
"""

from __future__ import annotations

from longrope.encodings.rope_methods.base import CONTEXT_FIELDS, RopeMethod, RotaryShape, registry
from longrope.encodings.rope_methods.batch import CandidateRows, batch_cos_sin, candidate_rows
from longrope.encodings.rope_methods.linear import LinearRope
from longrope.encodings.rope_methods.llama3 import Llama3Rope
from longrope.encodings.rope_methods.longrope import LongRope, longrope_inv_freq
from longrope.encodings.rope_methods.ntk import DynamicNtkRope, NtkRope
from longrope.encodings.rope_methods.yarn import YarnRope

ROPE_METHODS: dict[str, type[RopeMethod]] = registry(
    RopeMethod,
    LinearRope,
    NtkRope,
    DynamicNtkRope,
    YarnRope,
    LongRope,
    Llama3Rope,
)

__all__ = [
    "CONTEXT_FIELDS",
    "ROPE_METHODS",
    "CandidateRows",
    "DynamicNtkRope",
    "LinearRope",
    "Llama3Rope",
    "LongRope",
    "NtkRope",
    "RopeMethod",
    "RotaryShape",
    "YarnRope",
    "batch_cos_sin",
    "candidate_rows",
    "longrope_inv_freq",
    "registry",
]
