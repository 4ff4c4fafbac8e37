"""The embedded corpus: real text that ships with every Python interpreter, so nothing is downloaded.

Documents are the standard library's source files and its pydoc topics (the language reference text). Each
document belongs to a unit (a top-level stdlib package or module, or one pydoc topic), and each unit goes to
exactly one split (train / search / test) by a hash of its name, so no package lends text to two splits and
the search never sees the text the reference model was trained or tested on.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Split = Literal["train", "search", "test"]
SPLITS: tuple[Split, ...] = ("train", "search", "test")
# Share of units in each split, by a hash of the unit name: 80% train, 10% search, 10% test.
SPLIT_BUCKETS = {"train": range(0, 80), "search": range(80, 90), "test": range(90, 100)}
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})


@dataclass(frozen=True)
class Document:
    name: str  # where it came from: a path relative to the stdlib folder, or "pydoc:<topic>"
    unit: str  # the package / module / topic that decides its split
    text: str


def split_of(unit: str) -> Split:
    bucket = int(hashlib.sha256(unit.encode()).hexdigest(), 16) % 100
    return next(split for split, buckets in SPLIT_BUCKETS.items() if bucket in buckets)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _source_paths(root: Path) -> list[Path]:
    """The stdlib's .py files, pruning excluded folders before descending (site-packages can be huge)."""
    paths = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if d not in EXCLUDED_DIRS)
        paths.extend(Path(folder) / name for name in files if name.endswith(".py"))
    return sorted(paths)


def _source_documents() -> list[Document]:
    root = stdlib_root()
    documents = []
    for path in _source_paths(root):
        relative = path.relative_to(root)
        unit = relative.parts[0].removesuffix(".py")
        documents.append(Document(str(relative), unit, path.read_text(encoding="utf-8", errors="replace")))
    return documents


def _pydoc_documents() -> list[Document]:
    from pydoc_data.topics import topics  # pydoc_data: a large module, read only when the corpus is first built

    return [Document(f"pydoc:{name}", f"pydoc:{name}", topics[name]) for name in sorted(topics)]


def corpus_documents(split: Split) -> list[Document]:
    """Every document of one split, in a fixed order."""
    if split not in SPLITS:
        raise ValueError(f"split: unknown value {split!r}; expected one of {SPLITS}")
    return list(_split_documents(split))


@functools.cache
def _split_documents(split: Split) -> tuple[Document, ...]:
    return tuple(doc for doc in _pydoc_documents() + _source_documents() if split_of(doc.unit) == split)


def corpus_provenance() -> dict[str, str]:
    """What the corpus was made from: the interpreter whose stdlib it is."""
    return {
        "source": "python-stdlib",
        "python_version": platform.python_version(),
        "implementation": platform.python_implementation(),
    }
