"""Fixed token windows: every candidate of a job is scored on exactly the same tokens, so scores are paired.

A window is `length` tokens from one document at a seeded offset (one window per document, documents drawn by
a seeded permutation). Tokenized windows are cached on disk as a plain `.npz` (no pickle) keyed by a hash of
everything that decides them: the documents' text, the tokenizer, the length, the count and the seed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from longrope.workers.atomic_files import atomic_file
from longrope.workers.documents import TextDocument
from longrope.workers.errors import DataError
from longrope.workers.tokenization import TextTokenizer


@dataclass(frozen=True)
class Windows:
    tokens: np.ndarray  # [count, length] int64
    names: tuple[str, ...]  # the document of each window
    offsets: tuple[int, ...]  # its first token in that document

    @property
    def content_hash(self) -> str:
        """sha256 of the token ids: two jobs with the same hash scored the same tokens."""
        return hashlib.sha256(np.ascontiguousarray(self.tokens, dtype=np.int64).tobytes()).hexdigest()


def select_windows(token_docs: list[np.ndarray], names: list[str], *, length: int, count: int, seed: int) -> Windows:
    """`count` windows of `length` tokens, one per document long enough, chosen and placed by `seed`."""
    eligible = [i for i, doc in enumerate(token_docs) if len(doc) >= length]
    if len(eligible) < count:
        longest = max((len(doc) for doc in token_docs), default=0)
        raise DataError(
            f"data: need {count} documents of at least {length} tokens, found {len(eligible)} "
            f"(of {len(token_docs)} documents; the longest has {longest} tokens)"
        )
    rng = np.random.default_rng(seed)
    chosen = sorted(rng.permutation(eligible)[:count].tolist())
    offsets = [int(rng.integers(0, len(token_docs[i]) - length + 1)) for i in chosen]
    tokens = np.stack([token_docs[i][o : o + length] for i, o in zip(chosen, offsets, strict=True)])
    return Windows(tokens=tokens.astype(np.int64), names=tuple(names[i] for i in chosen), offsets=tuple(offsets))


def windows_key(documents: list[TextDocument], tokenizer: TextTokenizer, *, length: int, count: int, seed: int) -> str:
    digest = hashlib.sha256(f"{tokenizer.identity}|{length}|{count}|{seed}".encode())
    for doc in documents:
        digest.update(doc.name.encode() + b"\0" + doc.text.encode("utf-8", errors="surrogatepass") + b"\0")
    return digest.hexdigest()[:32]


def load_windows(
    documents: list[TextDocument],
    tokenizer: TextTokenizer,
    *,
    length: int,
    count: int,
    seed: int,
    cache_dir: Path | None = None,
) -> Windows:
    """Windows for a job, from the cache when the same inputs were tokenized before."""
    key = windows_key(documents, tokenizer, length=length, count=count, seed=seed)
    cache_file = Path(cache_dir) / f"windows-{key}.npz" if cache_dir else None
    if cache_file and cache_file.is_file():
        cached = _read_cache(cache_file)
        if cached is not None:
            return cached
    windows = select_windows(
        [tokenizer.encode(doc.text) for doc in documents],
        [doc.name for doc in documents],
        length=length,
        count=count,
        seed=seed,
    )
    if cache_file:
        _write_cache(cache_file, windows)
    return windows


def _read_cache(path: Path) -> Windows | None:
    """A damaged cache file is ignored (and rewritten), never trusted."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return Windows(
                tokens=data["tokens"],
                names=tuple(data["names"].tolist()),
                offsets=tuple(int(o) for o in data["offsets"]),
            )
    except (OSError, ValueError, KeyError):
        return None


def _write_cache(path: Path, windows: Windows) -> None:
    """Written atomically (`atomic_file`); an OS error (a path under a file, disk full) is one DataError."""
    try:
        with atomic_file(path, "wb") as tmp:
            np.savez(
                tmp,
                tokens=windows.tokens,
                names=np.array(windows.names, dtype=np.str_),
                offsets=np.array(windows.offsets, dtype=np.int64),
            )
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise DataError(f"data.cache_dir: cannot write the windows cache {str(path)!r} ({reason})") from None
