"""A closed-form RoPE method is its module plus its entry in the registry, and nothing else.

The test writes a new method's module (`long_waves`) into a copy of the package, adds it to `registry(...)` in
`encodings/rope_methods/__init__.py`, and runs tests/new_method_probe.py in a fresh interpreter whose `longrope` is
that copy. Every part that lists the closed forms must take the new method from there: the factory, the seeds a
config may name and the search's first generation, compare's rows (nominal, with LongRoPE's attention factor,
tuned), its best-baseline choice and its tuning grid, `longrope extrapolation`, `longrope encodings list` and the
`encodings factors` flags, and the GPU table's row count. The expected values are worked by hand from the method's
formula, never read back from the code under test.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import longrope.encodings
import longrope.search
import longrope.workers

TESTS = Path(__file__).resolve().parent
MODULE = '''"""A method written by tests/test_new_rope_method.py: the pairs whose period 2 pi / inv_freq_i exceeds
`edge` original lengths are interpolated by `factor`; the others are kept (NTK-by-parts with a hard edge)."""

from __future__ import annotations

import math
from typing import ClassVar

from pydantic import Field

from longrope.encodings.lazy_import import torch
from longrope.encodings.rope_methods.base import RopeMethod, RotaryShape


class LongWavesRope(RopeMethod):
    """Interpolate only the pairs longer than `edge` original lengths."""

    rope_type: ClassVar[str] = "long_waves"
    summary: ClassVar[str] = "test method: interpolate only the pairs longer than the original length"
    hf_keys: ClassVar[tuple[str, ...]] = ("factor", "original_max_position_embeddings", "edge")
    baseline: ClassVar[str | None] = "long_waves"
    seeds_search: ClassVar[bool] = True
    tuned: ClassVar[bool] = True
    factor: float = Field(ge=1.0)
    original_max_position_embeddings: int = Field(gt=0)
    edge: float = Field(default=1.0, gt=0.0, description="the period, in original lengths, past which a pair moves")

    @classmethod
    def nominal(cls, shape: RotaryShape, *, original: int, target: int, scale: float) -> LongWavesRope:
        return cls(max_position_embeddings=target, factor=scale, original_max_position_embeddings=original, **shape)

    def inv_freq(self, seq_len: int | None = None) -> torch.Tensor:
        base = self.original_inv_freq()
        long = 2 * math.pi / base > self.edge * self.original_max_position_embeddings
        return torch.where(long, base / self.factor, base)
'''
IMPORT_LINE = "from longrope.encodings.rope_methods.yarn import YarnRope\n"
REGISTRY_LINE = "    Llama3Rope,\n)\n"


def package_copy(root: Path) -> Path:
    """root/longrope/{encodings,search,workers}: the installed source folders (workers, unchanged and large,
    linked), with the new module and its registry entry in the copy of encodings/."""
    package = root / "longrope"
    package.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__")
    for module in (longrope.encodings, longrope.search):
        shutil.copytree(Path(module.__file__).parent, package / module.__name__.split(".")[-1], ignore=ignore)
    (package / "workers").symlink_to(Path(longrope.workers.__file__).parent, target_is_directory=True)
    methods = package / "encodings" / "rope_methods"
    (methods / "long_waves.py").write_text(MODULE)
    init = (methods / "__init__.py").read_text()
    assert init.count(IMPORT_LINE) == 1 and init.count(REGISTRY_LINE) == 1, "the registry moved: update this test"
    init = init.replace(
        IMPORT_LINE, IMPORT_LINE + "from longrope.encodings.rope_methods.long_waves import LongWavesRope\n"
    )
    (methods / "__init__.py").write_text(init.replace(REGISTRY_LINE, "    Llama3Rope,\n    LongWavesRope,\n)\n"))
    return root


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    root = package_copy(tmp_path_factory.mktemp("package"))
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, str(TESTS / "new_method_probe.py")], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "root": str(root)}


def part(report: dict, name: str) -> dict:
    """One part of the probe's report, or the failure it stopped at."""
    assert "error" not in report[name], report[name]["error"]
    return report[name]


def long_waves_factors(rotary_dim: int, theta: float, original: int, scale: float, edge: float = 1.0) -> list[float]:
    """By hand: pair i's period is 2 pi theta^(2i / d); past edge x original it is divided by the scale."""
    return [
        scale if 2 * math.pi * theta ** (2 * i / rotary_dim) > edge * original else 1.0 for i in range(rotary_dim // 2)
    ]


@pytest.fixture(scope="module")
def expected(report):
    """The new method's factors for the probe's job (the reference model, 128 -> 512 tokens, scale 4), and LongRoPE's
    attention factor there, sqrt(1 + ln 4 / ln 128)."""
    job = report["job"]

    def at(scale: float) -> list[float]:
        return long_waves_factors(job["rotary_dim"], job["theta"], job["original"], scale)

    return at, math.sqrt(1 + math.log(4) / math.log(job["original"]))


def test_the_factory_builds_it_from_a_model_config(report):
    """head_dim 8, theta 10000: inv_freq 1, 0.1, 0.01, 0.001 (periods 6.3, 63, 628, 6283 tokens); with a top-level
    original length of 16 the last three are interpolated by 4."""
    found = part(report, "registry")
    assert found["package"].startswith(report["root"]), "the probe must import the copy"
    assert found["registered"] and found["class"] == "LongWavesRope" and found["round_trip"]
    assert found["inv_freq"] == pytest.approx([1.0, 0.1 / 4, 0.01 / 4, 0.001 / 4], rel=1e-6)


def test_a_config_may_name_it_as_a_seed_and_the_search_starts_from_it(report, expected):
    at, _ = expected
    seeds = part(report, "seeds")
    assert seeds["config_seeds"] == ["long_waves", "pi"]
    assert "search.seeds.0 = 'long_wave': unknown seed 'long_wave'" in seeds["refused"]
    assert "long_waves" in seeds["refused"].split("a seed is one of ")[1]
    assert seeds["seed"] == pytest.approx(at(4.0), rel=1e-6) and 4.0 in seeds["seed"] and 1.0 in seeds["seed"]
    (asked,) = seeds["asked"]
    assert asked == pytest.approx(at(4.0), abs=0.005)  # on the search's 0.01 grid


def test_compare_has_its_rows_and_may_pick_it_as_the_best_baseline(report, expected):
    at, longrope_attention = expected
    found = part(report, "compare")
    rows = ["long_waves", "long_waves_longrope_attention", "long_waves_tuned"]
    assert set(rows) <= set(found["baselines"]) and set(rows) <= set(found["rows"])
    assert found["nominal"] == pytest.approx(at(4.0), rel=1e-6)
    factors, attention = found["longrope_attention"]
    assert factors == pytest.approx(at(4.0), rel=1e-6) and attention == pytest.approx(longrope_attention, rel=1e-12)
    assert found["best_baseline"] == "long_waves", "the lowest baseline, not the better given factors row"
    assert not found["drawn_as_given"] and "'long_waves' is a baseline's row" in found["label_refused"]


def test_the_tuning_grid_tries_it_and_keeps_its_best_setting(report, expected):
    """The coarse grid's default line: scale x 1, 1.5, 2 with its own attention factor (the method itself, 1 here),
    1.0, 1.1 and LongRoPE's (its factors as LongRoPE with that attention factor)."""
    at, longrope_attention = expected
    grid = part(report, "compare")["grid"]
    points = {"None": 1.0, "1.0": 1.0, "1.1": 1.1, "'longrope'": longrope_attention}
    assert set(grid) == {f"({m}, {p})" for m in (1.0, 1.5, 2.0) for p in points}
    for key, (kind, factors, attention) in grid.items():
        multiplier, point = key.strip("()").split(", ")
        assert kind == ("LongWavesRope" if point == "None" else "LongRope"), key
        assert factors == pytest.approx(at(4.0 * float(multiplier)), rel=1e-6), key
        assert attention == pytest.approx(points[point], rel=1e-12), key
    kind, settings = report["compare"]["tuned"]
    assert kind == "LongRope" and settings == pytest.approx({"long_waves_factor": 6.0, "attention_factor": 1.1})
    assert report["compare"]["settings_in_result"] == settings


def test_extrapolation_reads_the_rope_model_with_it(report, expected):
    at, _ = expected
    found = part(report, "extrapolation")
    assert "long_waves" in found["extensions"] and found["extensions"][-1] == "longrope"
    assert found["factors"] == pytest.approx(at(4.0), rel=1e-6)


def test_encodings_list_and_factors_know_it_and_its_flag(report):
    """`--edge 0.05`: with an original length of 16, periods past 0.8 tokens move, so every pair (6.3 tokens and
    up) is divided by 4."""
    found = part(report, "commands")
    listed = found["listed"]
    assert (listed["kind"], listed["hf_rope_type"]) == ("rotary", "long_waves")
    assert listed["where"] == "rope_methods.long_waves.LongWavesRope"
    assert found["edge_flag"]
    assert found["factors"] == [0, pytest.approx([4.0, 4.0, 4.0, 4.0], rel=1e-6)]
    assert long_waves_factors(8, 1e4, 16, 4.0, edge=0.05) == [4.0] * 4 != long_waves_factors(8, 1e4, 16, 4.0)


def test_the_gpu_tables_rows_count_its_three(report):
    sys.path.insert(0, str(TESTS.parent / "bench"))
    from gpu_table_parts.plan import TABLE_ROWS

    assert part(report, "commands")["table_rows"] == TABLE_ROWS + 3
