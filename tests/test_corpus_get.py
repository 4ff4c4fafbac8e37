"""`longrope corpus get`: real long documents from Debian's packages (python-docs, go-source, manuals), split by
document into search and test.

The packages themselves are fetched in the tests marked slow at the end; the other cases build small .deb archives
here and pin their checksums in place of the real ones, so every rule and refusal is exercised without a download.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from test_real_model_inputs import cli, private_cache, refused  # noqa: F401  (private_cache: an autouse fixture)

from longrope.search.downloads import debian_docs
from longrope.search.downloads.debian_docs import LONG_BYTES, SEARCH_EVERY, CorpusRecord
from longrope.search.downloads.sword_text import sword_books
from longrope.workers.documents import read_source

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


# ---- the packages themselves ----


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
