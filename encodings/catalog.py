"""Every positional-encoding method the suite implements, for `longrope encodings list`: read off the classes.

Each class states its own entry (name, kind, summary, transformers rope_type), so a new RoPE method is its file
and its line in `ROPE_METHODS`, and appears here with nothing else to edit."""

from __future__ import annotations

from dataclasses import dataclass

from longrope.encodings.absolute import LearnedAbsoluteEncoding, SinusoidalEncoding
from longrope.encodings.alibi import ALiBiEncoding
from longrope.encodings.cope import CoPEEncoding
from longrope.encodings.interface import EncodingKind, NoPE, PositionalEncoding
from longrope.encodings.multi_axis import Axial2DRopeEncoding, MRopeEncoding
from longrope.encodings.rope_methods import ROPE_METHODS, RopeMethod

# the block encodings besides the 1D RoPE family, in the order the list shows them (after that family)
OTHER_ENCODINGS: tuple[type[PositionalEncoding], ...] = (
    MRopeEncoding,
    Axial2DRopeEncoding,
    SinusoidalEncoding,
    LearnedAbsoluteEncoding,
    ALiBiEncoding,
    CoPEEncoding,
    NoPE,
)


@dataclass(frozen=True)
class MethodInfo:
    name: str
    kind: EncodingKind
    hf_rope_type: str | None  # the transformers rope_type, where transformers has the method
    summary: str
    where: str  # the class that implements it, as module.name under longrope.encodings


def catalog_entries() -> tuple[MethodInfo, ...]:
    """The RoPE family as `ROPE_METHODS` registers it (so a method registered at run time is listed too), then the
    other encodings."""
    rope = [
        MethodInfo(cls.rope_type, "rotary", cls.rope_type if cls.in_transformers else None, cls.summary, _where(cls))
        for cls in ROPE_METHODS.values()
    ]
    other = [MethodInfo(cls.name, cls.kind, cls.hf_rope_type, cls.summary, _where(cls)) for cls in OTHER_ENCODINGS]
    return (*rope, *other)


def _where(cls: type[RopeMethod] | type[PositionalEncoding]) -> str:
    return f"{cls.__module__.removeprefix('longrope.encodings.')}.{cls.__qualname__}"
