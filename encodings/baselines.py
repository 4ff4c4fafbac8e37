"""The closed-form context-extension methods, as the registry (`ROPE_METHODS`) states them: the one source of every
list of baselines, seeds and tuned methods in longrope-search.

These are the methods a LongRoPE search is measured against (and seeded by). Each class says, in its own file, the
name it goes by, whether it seeds a search, whether compare tunes it, and its nominal instance for a scale (its
authors' or transformers' setting for a model trained at `original` tokens and read at `target`):
none (plain RoPE, unchanged), pi (Position Interpolation), ntk (NTK-aware), dynamic (Dynamic NTK), yarn (YaRN) and
llama3 (Llama 3.1's bands) today.
"""

from __future__ import annotations

from longrope.encodings.rope_methods import ROPE_METHODS, RopeMethod, RotaryShape


def closed_forms() -> dict[str, type[RopeMethod]]:
    """{baseline name: class}, in registry order; LongRoPE, whose factors are searched, is none of them."""
    return {cls.baseline: cls for cls in ROPE_METHODS.values() if cls.baseline is not None}


def seed_names() -> tuple[str, ...]:
    """The closed forms whose nominal factors may start a search (`search.seeds`)."""
    return tuple(name for name, cls in closed_forms().items() if cls.seeds_search)


def tuned_names() -> tuple[str, ...]:
    """The closed forms compare also reads tuned on the search split and with LongRoPE's attention factor."""
    return tuple(name for name, cls in closed_forms().items() if cls.tuned)


def tuned_row(name: str) -> str:
    """The name of a closed form tuned on the search split: compare's row, and the seed name that asks for its
    tuning grid's settings as seeds."""
    return f"{name}_tuned"


def seed_choices() -> tuple[str, ...]:
    """What `search.seeds` may name: a closed form at its nominal setting, or a tuned one (its grid's settings)."""
    return (*seed_names(), *map(tuned_row, tuned_names()))


def baseline_methods(
    *, head_dim: int, rope_theta: float, partial_rotary_factor: float, original: int, target: int
) -> dict[str, RopeMethod]:
    """{name: method} of every closed form for reading a model trained at `original` tokens at `target` tokens."""
    shape = RotaryShape(head_dim=head_dim, rope_theta=rope_theta, partial_rotary_factor=partial_rotary_factor)
    scale = target / original
    return {
        name: cls.nominal(shape, original=original, target=target, scale=scale) for name, cls in closed_forms().items()
    }
