"""Long real documents on any machine: a Debian documentation package's text files, split into search and test
documents.

The corpus `python-docs` is the Python 3.11 documentation's reStructuredText sources (Debian `python3.11-doc`,
`usr/share/doc/python3.11/html/_sources/**/*.rst.txt`: 497 documents, 47 of them over 16k SmolLM2 tokens, 5 over
32k). The corpus `go-source` is the Go 1.19 source tree (Debian `golang-1.19-src`, `usr/share/go-1.19/src/**/*.go`:
5557 documents, 89 of them over 32k SmolLM2 tokens, 51 of those generated tables and rewrite rules), for 32k
windows: its files are saved as `NAME.go.txt`, byte for byte, since `.go` is no suffix the documents reader takes
(docs/corpora-survey.md: why this package). The composite corpus `manuals` is prose and technical manuals from
four packages, each in a folder of its own below each split: `kjv/` the King James Bible (Debian `sword-text-kjv`,
a SWORD zText module of OSIS XML, converted to plain text, one document per book: sword_text.py states the rule),
`perl-doc/` the Perl 5.36 manual pages (`perl-doc`, `*.pod` saved as `NAME.pod.txt` byte for byte), `vim-runtime/`
the Vim 9.0 help files (`doc/*.txt`) and `linux-doc/` the Linux 6.1 documentation sources (`linux-doc-6.1`, every
`.rst.txt`): 3607 documents, 47 MB, 51 of them over 32k SmolLM2 tokens, for 32k windows of prose and manuals
(go-source: of code). Each .deb is fetched from the Debian mirror at the pinned URL, else from
snapshot.debian.org by its SHA1 (once a newer stable update replaces it in the mirror's pool), or given with --deb
(that exact file: `apt-get download` fetches the current version; for `manuals`, the folder holding its four
.debs, found by package name); it is checked against its pinned sha256 and read
with the standard library: a .deb is an `ar` archive whose `data.tar.xz` holds the files.

The split is by document, deterministic and stratified by size, so both splits get long documents whatever the
tokenizer: documents are ordered by the sha256 of their path; among the long ones (at least LONG_BYTES bytes),
every third in that order (the 1st, 4th, ...) goes to search and the rest to test; the shorter ones likewise.
No document is in both. A composite corpus ranks each package's documents apart, with its own threshold
(`manuals`: 140,000 bytes, so that both splits get enough documents of 32k tokens). DIR/corpus.json records the
package, its checksum, the rule and every document's split and sha256 (a composite corpus: also every document's
package and each package's version, URL and sha256).
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
from longrope.search.downloads.sword_text import sword_books
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
    # appended to each document's name (its bytes unchanged) where `suffix` is not one the documents reader takes
    text_suffix: str = ""
    # in a composite corpus: the folder, below each split, of this package's documents
    folder: str = ""
    # "files": each file below `prefix` ending in `suffix` is a document; "sword": those files are a SWORD zText
    # Bible module, one document per book as plain text (sword_text.py)
    reader: Literal["files", "sword"] = "files"


class DebianBundle(BaseModel):
    """A composite corpus: several pinned packages, each in its own folder below each split; the split rule runs
    within each package (its own sha256(path) order and size classes), with this corpus's threshold and ratio."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    packages: tuple[DebianPackage, ...]
    card: str
    long_bytes: int = LONG_BYTES
    search_every: int = SEARCH_EVERY


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
    ),
    "go-source": DebianPackage(
        package="golang-1.19-src",
        version="1.19.8-2",
        pool_path="pool/main/g/golang-1.19/golang-1.19-src_1.19.8-2_all.deb",
        sha256="2dfa82fe4f08f4e0193c532e561af4c91871f5235608f04f2bb8d57bb288df5a",
        sha1="3387075f6362ec2c26c7c0958ffb72b6f3a51185",
        prefix="usr/share/go-1.19/src/",
        suffix=".go",
        text_suffix=".txt",
        card="Go 1.19 source tree (Debian golang-1.19-src), 5557 .go files as .go.txt, 89 over 32k SmolLM2 tokens",
    ),
    "manuals": DebianBundle(
        packages=(
            DebianPackage(
                package="sword-text-kjv",
                version="14.3-1",
                pool_path="pool/main/s/sword-text-kjv/sword-text-kjv_14.3-1_all.deb",
                sha256="9f463f28ce665f6f528fc723179722bced880a4c5485f7a41bf742838315de57",
                sha1="f1243f951811f073842b0d67fec8cddd90b40f2f",
                prefix="usr/share/sword/modules/texts/ztext/engKJV2006eb/",
                suffix="",
                card="King James Bible",
                folder="kjv",
                reader="sword",
            ),
            DebianPackage(
                package="perl-doc",
                version="5.36.0-7+deb12u3",
                pool_path="pool/main/p/perl/perl-doc_5.36.0-7%2bdeb12u3_all.deb",
                sha256="e9e3564ff5ade27de0585835f2acad769bcc545c0a0045a9f55d5401f27f7591",
                sha1="bf163e858d2e7ae1dae0d5f7366228545167acaa",
                prefix="usr/share/perl/5.36.0/pod/",
                suffix=".pod",
                text_suffix=".txt",
                card="Perl 5.36 manual pages",
                folder="perl-doc",
            ),
            DebianPackage(
                package="vim-runtime",
                version="2:9.0.1378-2+deb12u2",
                pool_path="pool/main/v/vim/vim-runtime_9.0.1378-2%2bdeb12u2_all.deb",
                sha256="6a3dd2317a593742cb247f3494d986b3127887dbe1449253b8efa6112289854e",
                sha1="24d528e6eae55755f4785e453e31fc4de543839b",
                prefix="usr/share/vim/vim90/doc/",
                suffix=".txt",
                card="Vim 9.0 help files",
                folder="vim-runtime",
            ),
            DebianPackage(
                package="linux-doc-6.1",
                version="6.1.176-1",
                pool_path="pool/main/l/linux/linux-doc-6.1_6.1.176-1_all.deb",
                sha256="0d843674607703b9ef8c1db5e715c38ed52ff23574feabfe0d961d552126859f",
                sha1="97a5e89b363de0a3439a2b0953a366683e859d77",
                prefix="usr/share/doc/linux-doc-6.1/html/_sources/",
                suffix=".rst.txt",
                card="Linux 6.1 documentation sources",
                folder="linux-doc",
            ),
        ),
        # 29 documents of at least 140,000 bytes, all of 32k tokens; the rule gives 17 search and 34 test
        # documents of 32k SmolLM2 tokens (60,000 would give 19 and 32: docs/corpora-survey.md)
        long_bytes=140_000,
        card="KJV Bible (66 books as text), Perl 5.36 pod, Vim 9.0 help, Linux 6.1 docs (Debian): 3607 documents, "
        "51 over 32k SmolLM2 tokens",
    ),
}


class CorpusDocument(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str  # relative to its split's folder
    split: Literal["search", "test"]
    bytes: int
    sha256: str
    package: str = ""  # in a composite corpus: the Debian package it came from


class PackageSource(BaseModel):
    """One package of a composite corpus, as fetched."""

    model_config = ConfigDict(extra="forbid")

    package: str
    version: str
    url: str
    sha256: str
    folder: str


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
    # a composite corpus: its packages (`package` and `version` above list them, `sha256` is that of their sha256s,
    # one a line, `url` the mirror)
    packages: list[PackageSource] = []


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


def split_of(rank: int, search_every: int = SEARCH_EVERY) -> Literal["search", "test"]:
    """`rank`: the document's place, in sha256-of-path order, among the documents of its size class."""
    return "search" if rank % search_every == 0 else "test"


def split_documents(
    texts: dict[str, bytes],
    *,
    strata: dict[str, str] | None = None,
    long_bytes: int = LONG_BYTES,
    search_every: int = SEARCH_EVERY,
) -> dict[str, Literal["search", "test"]]:
    """Each document's split; `strata` (a composite corpus: each path's package) ranks each package apart."""
    order = sorted(texts, key=lambda path: hashlib.sha256(path.encode()).hexdigest())
    splits: dict[str, Literal["search", "test"]] = {}
    ranks: dict[tuple[str, bool], int] = {}
    for path in order:
        stratum = (strata[path] if strata else "", len(texts[path]) >= long_bytes)
        splits[path] = split_of(ranks.get(stratum, 0), search_every)
        ranks[stratum] = ranks.get(stratum, 0) + 1
    return splits


def split_rule(long_bytes: int, search_every: int, composite: bool) -> str:
    nth = f"{search_every}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(search_every, 'th') }"
    within = " within each package" if composite else ""
    return (
        f"sha256(path) order; every {nth} document of each size class (>= {long_bytes} bytes or not){within} to "
        "search, the rest to test"
    )


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
    """{path below the prefix, plus the corpus's text_suffix: bytes} of every document file in the package (a
    "sword" package: its books as text, sword_text.py), below its folder where it has one."""
    archive = ar_member(path, "data.tar.xz")
    documents = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:xz") as tar:
            for member in tar:
                name = member.name.removeprefix("./")
                if member.isfile() and name.startswith(corpus.prefix) and name.endswith(corpus.suffix):
                    documents[name.removeprefix(corpus.prefix) + corpus.text_suffix] = tar.extractfile(member).read()
    except (tarfile.TarError, EOFError, OSError) as exc:  # lzma.LZMAError is an OSError
        raise DownloadError(f"deb: {str(path)!r}'s data.tar.xz cannot be read ({exc})") from exc
    if corpus.reader == "sword":
        documents = sword_books(documents)
    return {f"{corpus.folder}/{name}" if corpus.folder else name: text for name, text in documents.items()}


def given_deb(deb: Path, corpus: DebianPackage, composite: bool) -> Path:
    """--deb: the package's file itself, or for a composite corpus the folder holding its packages, each found by
    its name (`apt-get download`'s or the pool's) and checked against its pinned sha256."""
    if not composite:
        check_deb(deb, corpus)
        return deb
    if not Path(deb).is_dir():
        raise DownloadError(f"deb: {str(deb)!r} is not a folder (a composite corpus takes the folder of its .debs)")
    for candidate in sorted(Path(deb).glob(f"{corpus.package}_*.deb")):
        if sha256_file(candidate) == corpus.sha256:
            return candidate
    raise DownloadError(
        f"deb: {str(deb)!r} holds no {corpus.package}_*.deb of {corpus.package} {corpus.version} (sha256 "
        f"{corpus.sha256})"
    )


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
    composite = isinstance(corpus, DebianBundle)
    packages = corpus.packages if composite else (corpus,)
    debs = [given_deb(Path(deb), package, composite) for package in packages] if deb is not None else None
    texts: dict[str, bytes] = {}
    origin: dict[str, str] = {}
    for at, package in enumerate(packages):
        for path, text in deb_documents(debs[at] if debs else fetch_deb(package), package).items():
            texts[path], origin[path] = text, package.package
    long_bytes = corpus.long_bytes if composite else LONG_BYTES
    search_every = corpus.search_every if composite else SEARCH_EVERY
    splits = split_documents(
        texts, strata=origin if composite else None, long_bytes=long_bytes, search_every=search_every
    )
    urls = [f"{MIRROR.rstrip('/')}/{package.pool_path}" for package in packages]
    record = CorpusRecord(
        name=name,
        package=", ".join(package.package for package in packages),
        version=", ".join(package.version for package in packages),
        url=MIRROR.rstrip("/") if composite else urls[0],
        sha256=hashlib.sha256("".join(f"{p.sha256}\n" for p in packages).encode()).hexdigest()
        if composite
        else corpus.sha256,
        split_rule=split_rule(long_bytes, search_every, composite),
        documents=[
            CorpusDocument(
                path=path,
                split=splits[path],
                bytes=len(texts[path]),
                sha256=hashlib.sha256(texts[path]).hexdigest(),
                package=origin[path] if composite else "",
            )
            for path in sorted(texts)
        ],
        packages=[
            PackageSource(package=p.package, version=p.version, url=url, sha256=p.sha256, folder=p.folder)
            for p, url in zip(packages, urls, strict=True)
        ]
        if composite
        else [],
    )
    with staged_folder(out_dir) as staging:
        for document in record.documents:
            target = staging / document.split / document.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(texts[document.path])
        # a single package's record keeps its fields as before (no per-document package, no package list)
        (staging / CORPUS_FILE).write_text(record.model_dump_json(indent=1, exclude_defaults=True) + "\n")
    return record
