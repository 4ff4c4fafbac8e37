"""Long real documents on any machine: a Debian documentation package's text files, split into search and test
documents.

The corpus `python-docs` is the Python 3.11 documentation's reStructuredText sources (Debian `python3.11-doc`,
`usr/share/doc/python3.11/html/_sources/**/*.rst.txt`: 497 documents, 47 of them over 16k SmolLM2 tokens). The
.deb is fetched from the Debian mirror at the pinned URL, else from snapshot.debian.org by its SHA1 (once a newer
stable update replaces it in the mirror's pool), or given with --deb (that exact file: `apt-get download` fetches
the current version); it is checked against its pinned sha256 and read with the standard library: a .deb is an
`ar` archive whose `data.tar.xz` holds the files.

The split is by document, deterministic and stratified by size, so both splits get long documents whatever the
tokenizer: documents are ordered by the sha256 of their path; among the long ones (at least LONG_BYTES bytes),
every third in that order (the 1st, 4th, ...) goes to search and the rest to test; the shorter ones likewise.
No document is in both. DIR/corpus.json records the package, its checksum, the rule and every document's split
and sha256.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from longrope.search.downloads.model_wheels import DownloadError, check_pinned
from longrope.workers.errors import DataError, one_line
from longrope.workers.gguf_model import cache_root, sha256_file, staged_folder

LONG_BYTES = 60_000
SEARCH_EVERY = 3  # one document in three goes to search
CORPUS_FILE = "corpus.json"
MIRROR = os.environ.get("LONGROPE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# snapshot.debian.org keeps every file Debian ever published, served by its SHA1 at /file/<sha1>: the pinned
# package stays reachable after the mirror's pool drops it for a newer stable update
SNAPSHOT = "https://snapshot.debian.org/file"
AR_MAGIC = b"!<arch>\n"


class DebianPackage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    package: str
    version: str
    pool_path: str  # below the mirror's root
    sha256: str
    sha1: str  # snapshot.debian.org's key for the same file
    prefix: str  # the folder inside data.tar whose files are the documents
    suffix: str
    card: str


KNOWN_CORPORA = {
    "python-docs": DebianPackage(
        package="python3.11-doc",
        version="3.11.2-6+deb12u8",
        pool_path="pool/main/p/python3.11/python3.11-doc_3.11.2-6%2bdeb12u8_all.deb",
        sha256="50eb63e7f636c4281e9ce1b8f10386f1def42159eddce34fc1f41c46261df71b",
        sha1="d4a9ab01ca393dc30872e1ea65f14be24cfcfe73",
        prefix="usr/share/doc/python3.11/html/_sources/",
        suffix=".rst.txt",
        card="Python 3.11 documentation sources (Debian python3.11-doc), 497 reST documents",
    )
}


class CorpusDocument(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str  # relative to its split's folder
    split: Literal["search", "test"]
    bytes: int
    sha256: str


class CorpusRecord(BaseModel):
    """DIR/corpus.json: where the documents came from and which split each went to."""

    model_config = ConfigDict(extra="forbid")

    name: str
    package: str
    version: str
    url: str
    sha256: str
    split_rule: str
    documents: list[CorpusDocument]


def read_corpus_record(folder: Path) -> CorpusRecord | None:
    """FOLDER/corpus.json as `get_corpus` wrote it; None where there is none; one DataError where it is damaged."""
    path = Path(folder) / CORPUS_FILE
    if not path.is_file():
        return None
    try:
        return CorpusRecord.model_validate_json(path.read_bytes())
    except (ValidationError, OSError) as exc:
        if isinstance(exc, ValidationError):
            error = exc.errors()[0]
            reason = f"{'.'.join(str(part) for part in error['loc']) or 'the file'}: {error['msg']}"
        else:
            reason = exc.strerror
        raise DataError(f"corpus record: {str(path)!r} is not a corpus.json longrope wrote ({reason})") from exc


def split_of(rank: int) -> Literal["search", "test"]:
    """`rank`: the document's place, in sha256-of-path order, among the documents of its size class."""
    return "search" if rank % SEARCH_EVERY == 0 else "test"


def split_documents(texts: dict[str, bytes]) -> dict[str, Literal["search", "test"]]:
    order = sorted(texts, key=lambda path: hashlib.sha256(path.encode()).hexdigest())
    splits, ranks = {}, {True: 0, False: 0}
    for path in order:
        long = len(texts[path]) >= LONG_BYTES
        splits[path] = split_of(ranks[long])
        ranks[long] += 1
    return splits


def fetch_deb(corpus: DebianPackage) -> Path:
    """The pinned .deb from the cache, else from the mirror, else from snapshot.debian.org, checked against its
    sha256 before it enters the cache (each download goes to a file of its own, so concurrent runs cannot mix)."""
    cached = cache_root() / "debs" / Path(corpus.pool_path).name.replace("%2b", "+")
    if cached.is_file() and sha256_file(cached) == corpus.sha256:
        return cached
    cached.parent.mkdir(parents=True, exist_ok=True)
    failures = []
    for url in deb_urls(corpus):
        handle, name = tempfile.mkstemp(prefix=f".{cached.name}.", dir=cached.parent)
        partial = Path(name)
        try:
            with urllib.request.urlopen(url, timeout=120) as response, os.fdopen(handle, "wb") as out:
                shutil.copyfileobj(response, out, 1 << 20)
            check_deb(partial, corpus)
        except (urllib.error.URLError, OSError, DownloadError) as exc:
            partial.unlink(missing_ok=True)
            failures.append(f"{url}: {one_line(exc, 120)}")
            continue
        os.replace(partial, cached)
        return cached
    raise DownloadError(
        f"download of {corpus.package} {corpus.version} failed ({'; '.join(failures)}); download that exact file "
        "and pass it with --deb"
    )


def deb_urls(corpus: DebianPackage) -> list[str]:
    """Where the pinned package is fetched from, in order: the mirror's pool, then Debian's permanent snapshot."""
    return [f"{MIRROR.rstrip('/')}/{corpus.pool_path}", f"{SNAPSHOT}/{corpus.sha1}"]


def check_deb(path: Path, corpus: DebianPackage) -> None:
    check_pinned(path, corpus.sha256, "deb", f"{corpus.package} {corpus.version}")


def ar_member(path: Path, name: str) -> bytes:
    """One member of an `ar` archive (a .deb): 60-byte headers, each member padded to an even size."""
    data = Path(path).read_bytes()
    if not data.startswith(AR_MAGIC):
        raise DownloadError(f"deb: {str(path)!r} is not a Debian package (no ar header)")
    at = len(AR_MAGIC)
    while at + 60 <= len(data):
        header = data[at : at + 60]
        member, size = header[:16].decode().strip().rstrip("/"), int(header[48:58].decode().strip())
        if member == name:
            return data[at + 60 : at + 60 + size]
        at += 60 + size + size % 2
    raise DownloadError(f"deb: {str(path)!r} has no {name}")


def deb_documents(path: Path, corpus: DebianPackage) -> dict[str, bytes]:
    """{path below the prefix: bytes} of every document file in the package."""
    archive = ar_member(path, "data.tar.xz")
    documents = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:xz") as tar:
            for member in tar:
                name = member.name.removeprefix("./")
                if member.isfile() and name.startswith(corpus.prefix) and name.endswith(corpus.suffix):
                    documents[name.removeprefix(corpus.prefix)] = tar.extractfile(member).read()
    except (tarfile.TarError, EOFError, OSError) as exc:  # lzma.LZMAError is an OSError
        raise DownloadError(f"deb: {str(path)!r}'s data.tar.xz cannot be read ({exc})") from exc
    return documents


def get_corpus(name: str, out_dir: Path, *, deb: Path | None = None) -> CorpusRecord:
    """`longrope corpus get NAME DIR`: DIR/search/, DIR/test/ and DIR/corpus.json, or one error and nothing
    written (the folder is built beside DIR and renamed into place)."""
    if name not in KNOWN_CORPORA:
        raise DownloadError(f"corpus: unknown corpus {name!r} (known: {', '.join(sorted(KNOWN_CORPORA))})")
    corpus, out_dir = KNOWN_CORPORA[name], Path(out_dir)
    if out_dir.exists():
        raise DownloadError(f"DIR: {str(out_dir)!r} already exists; give a new folder (nothing is overwritten)")
    if not out_dir.parent.is_dir():
        raise DownloadError(f"DIR: the folder {str(out_dir.parent)!r} does not exist")
    if deb is not None:
        check_deb(deb, corpus)
    texts = deb_documents(Path(deb) if deb is not None else fetch_deb(corpus), corpus)
    splits = split_documents(texts)
    record = CorpusRecord(
        name=name,
        package=corpus.package,
        version=corpus.version,
        url=f"{MIRROR.rstrip('/')}/{corpus.pool_path}",
        sha256=corpus.sha256,
        split_rule=f"sha256(path) order; every {SEARCH_EVERY}rd document of each size class (>= {LONG_BYTES} bytes "
        "or not) to search, the rest to test",
        documents=[
            CorpusDocument(
                path=path, split=splits[path], bytes=len(texts[path]), sha256=hashlib.sha256(texts[path]).hexdigest()
            )
            for path in sorted(texts)
        ],
    )
    with staged_folder(out_dir) as staging:
        for document in record.documents:
            target = staging / document.split / document.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(texts[document.path])
        (staging / CORPUS_FILE).write_text(record.model_dump_json(indent=1) + "\n")
    return record
