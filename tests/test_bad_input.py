"""Bad rope_parameters: each gives one EncodingConfigError that names the key (and the value)."""

from __future__ import annotations

import math
import warnings

import pytest

from longrope.encodings import EncodingConfigError, from_hf, from_hf_config
from longrope.encodings.absolute import SinusoidalEncoding
from longrope.encodings.alibi import alibi_slopes
from longrope.encodings.multi_axis import mrope_pair_axes

LONG = {"short_factor": [1.0] * 64, "long_factor": [2.0] * 64, "original_max_position_embeddings": 4096}

CASES = [
    ({"rope_type": "linear"}, r"rope_parameters\.factor: required for rope_type 'linear'"),
    ({"rope_type": "dynamic"}, r"rope_parameters\.factor: required"),
    ({"rope_type": "yarn", "factor": 8}, r"rope_parameters\.original_max_position_embeddings: required"),
    (
        {"rope_type": "llama3", "factor": 8, "high_freq_factor": 4, "original_max_position_embeddings": 8192},
        r"rope_parameters\.low_freq_factor: required",
    ),
    (
        {"rope_type": "longrope", "short_factor": [1.0] * 64, "original_max_position_embeddings": 4096},
        r"rope_parameters\.long_factor: required",
    ),
    (
        {"rope_type": "longrope", **LONG, "long_factor": [2.0] * 63},
        r"rope_parameters\.long_factor: expected 64 values .* got 63",
    ),
    (
        {"rope_type": "longrope", **LONG, "short_factor": [1.0] * 65},
        r"rope_parameters\.short_factor: expected 64 values .* got 65",
    ),
    (
        {"rope_type": "longrope", **LONG, "long_factor": [2.0] * 63 + [0.0]},
        r"rope_parameters\.long_factor: every factor must be > 0, got 0\.0 at pair 63",
    ),
    ({"rope_type": "longrope", **LONG, "long_factor": "2.0"}, r"rope_parameters\.long_factor = '2\.0'"),
    ({"rope_type": "linear", "factor": 0.5}, r"rope_parameters\.factor = 0\.5: .*greater than or equal to 1"),
    ({"rope_type": "yarn", "factor": 0.9, "original_max_position_embeddings": 4096}, r"rope_parameters\.factor = 0\.9"),
    ({"rope_type": "frobnicate"}, r"rope_parameters\.rope_type: unknown value 'frobnicate'"),
    ({"type": "rotary9000"}, r"rope_parameters\.rope_type: unknown value 'rotary9000'"),
    ({"rope_type": "linear", "factor": math.nan}, r"rope_parameters\.factor: must be finite, got nan"),
    ({"rope_type": "default", "rope_theta": math.inf}, r"rope_parameters\.rope_theta: must be finite, got inf"),
    (
        {"rope_type": "longrope", **LONG, "long_factor": [2.0] * 10 + [math.nan] + [2.0] * 53},
        r"rope_parameters\.long_factor\[10\]: must be finite, got nan",
    ),
    (
        {"rope_type": "yarn", "factor": 8, "original_max_position_embeddings": 4096, "attention_factor": -1.0},
        r"rope_parameters\.attention_factor = -1\.0",
    ),
    ({"rope_type": "default", "rope_theta": 1.0}, r"rope_parameters\.rope_theta = 1\.0"),
    ({"rope_type": "default", "partial_rotary_factor": 1.5}, r"rope_parameters\.partial_rotary_factor = 1\.5"),
    ({"rope_type": "default", "partial_rotary_factor": 0.01}, r"partial_rotary_factor: .* rotary dim 1"),
    (
        {
            "rope_type": "llama3",
            "factor": 8,
            "low_freq_factor": 4,
            "high_freq_factor": 1,
            "original_max_position_embeddings": 8192,
        },
        r"high_freq_factor: must be greater than low_freq_factor",
    ),
]


@pytest.mark.parametrize(("params", "message"), CASES, ids=[str(i) for i in range(len(CASES))])
def test_bad_rope_parameters_name_the_key(params, message):
    with pytest.raises(EncodingConfigError, match=message) as info:
        from_hf(params, head_dim=128, max_position_embeddings=32768)
    assert "\n" not in str(info.value)


def test_not_a_dict():
    with pytest.raises(EncodingConfigError, match="rope_parameters: expected a dict, got list"):
        from_hf([1, 2], head_dim=128, max_position_embeddings=4096)


def test_bad_model_shape_names_the_field():
    with pytest.raises(EncodingConfigError, match=r"head_dim = 0"):
        from_hf({"rope_type": "default"}, head_dim=0, max_position_embeddings=4096)
    with pytest.raises(EncodingConfigError, match=r"max_position_embeddings: expected a positive integer"):
        from_hf_config({"hidden_size": 64, "num_attention_heads": 2})


def test_unknown_keys_warn_as_transformers_does_and_are_ignored():
    with pytest.warns(UserWarning, match=r"ignoring keys unknown to rope_type 'linear': \['beta_fast'\]"):
        method = from_hf({"rope_type": "linear", "factor": 2, "beta_fast": 3}, head_dim=64, max_position_embeddings=64)
    assert method.to_hf() == {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}


def test_legacy_names_are_accepted():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        su = from_hf({"type": "su", **LONG}, head_dim=128, max_position_embeddings=32768)
        mrope = from_hf({"type": "mrope", "mrope_section": [16, 24, 24]}, head_dim=128, max_position_embeddings=4096)
    assert su.rope_type == "longrope" and mrope.rope_type == "default"


def test_from_hf_config_resolves_phi3_style_top_level_keys():
    config = {
        "hidden_size": 3072,
        "num_attention_heads": 32,
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [1.5] * 48},
    }
    method = from_hf_config(config)
    assert (method.head_dim, method.original_max_position_embeddings, method.scale) == (96, 4096, 32.0)


def test_other_encodings_reject_bad_shapes():
    with pytest.raises(EncodingConfigError, match="n_heads"):
        alibi_slopes(0)
    with pytest.raises(EncodingConfigError, match="d_model"):
        SinusoidalEncoding(7)
    with pytest.raises(EncodingConfigError, match="mrope_section"):
        mrope_pair_axes([16, 24])
