"""The shape of a comparison (compare.json) and the names of its rows.

compare.json, one object:
- `target_length`, `original_length`: the job's lengths; `start_length`: where the extension starts (the original
  length, or the length a model that ships RoPE scaling serves); `lengths`: the lengths scored, in order;
- `windows`: {length: test windows scored there}; `rope`: {`rope_theta`, `pairs`} (the factors plot's wavelengths);
- `best_baseline`: the baseline with the lowest mean NLL at the target, which the paired differences are to;
- one `NAME_tuned` per tuned closed form (`ntk_tuned`, `yarn_tuned`): its factor (`NAME_factor`) and attention
  factor picked on the search split, and `tuning_grid`: {`name`: "full" or "coarse", `settings`: how many were tried};
- `methods`: {row label: MethodRow}, baselines first, then the given factors, then the (vLLM) twins.

Every per-length mapping is keyed by the length as a string ("1024"), in memory as in the JSON, so a result read
back from compare.json is the same object as the one compare returned.
"""

from __future__ import annotations

from typing import Any, TypedDict

from longrope.encodings.baselines import closed_forms, tuned_names, tuned_row
from longrope.search.job.job_context import LONGROPE_ATTENTION_ROWS, SHIPPED  # noqa: F401 (compare's row names)

# compare's baseline rows, in its order: each closed form at its nominal setting (`JobContext.baselines`), each tuned
# one read with LongRoPE's attention factor, then tuned (the registry's `baseline` and `tuned`, `encodings.baselines`)
BASELINES = (*closed_forms(), *LONGROPE_ATTENTION_ROWS, *map(tuned_row, tuned_names()))
VLLM_SUFFIX = "(vLLM)"  # a row as a vLLM engine with max_model_len = the target applies the method

Interval = list[float]  # [value, low, high]: a 95% interval


class MethodRow(TypedDict, total=False):
    """One row of compare.json's `methods`."""

    runtime: str  # "transformers", or "vllm" for a (vLLM) twin
    perplexity: dict[str, Interval]  # {length: [exp(mean NLL), exp(low), exp(high)]}
    factors: list[float]  # per-pair factors at the target length
    attention_factor: float
    nll_per_window: dict[str, list[float]]  # {length: mean NLL per token of each test window, in window order}
    factors_target_length: int  # a given factors row: the length its factors were searched for
    paired_difference_to_best_baseline: Interval  # mean NLL difference per token at the target, same windows
    paired_difference_to_shipped: Interval  # the same at the start length, to the `none` row (what it costs there)
    needle: dict[str, dict[str, Any]]  # {length: needle cell (`needle_report.needle_cell`)}


class CompareResult(TypedDict, total=False):
    """compare.json (see the module docstring)."""

    target_length: int
    original_length: int
    start_length: int
    lengths: list[int]
    windows: dict[str, int]
    rope: dict[str, float]
    best_baseline: str
    ntk_tuned: dict[str, float]  # and a NAME_tuned for every other tuned closed form
    yarn_tuned: dict[str, float]
    tuning_grid: dict[str, Any]
    methods: dict[str, MethodRow]


def base_method(name: str) -> str:
    return name.removesuffix(f" {VLLM_SUFFIX}")


def is_given(name: str) -> bool:
    """A row of a given factors file (labels never take a baseline's name), drawn thicker than the baselines."""
    return base_method(name) not in BASELINES
