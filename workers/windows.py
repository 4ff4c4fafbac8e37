"""Fixed token windows: every candidate of a job is scored on exactly the same tokens, so scores are paired.

A window is `length` tokens from one document at a seeded offset (one window per document, documents drawn by
a seeded permutation), read at `length - 1` positions. Which predictions count is the window's loss mask, set by
its objective:
- perplexity: every position;
- tail: positions at or past the original length (the ones the rescaled frequencies exist for);
- needle: the answer's tokens of a needle window (`needles.py`, LongRoPE2's needle-driven objective).
Tokenized windows and their masks are cached on disk as a plain `.npz` (no pickle) keyed by a hash of everything
that decides them: the documents' text, the tokenizer, the length, the count, the seed and the objective.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from longrope.workers.atomic_files import atomic_file
from longrope.workers.documents import TextDocument
from longrope.workers.errors import DataError, WindowsCacheError
from longrope.workers.needles import answer_mask, needle_format, needle_windows
from longrope.workers.objective_names import OBJECTIVES
from longrope.workers.tokenization import TextTokenizer


@dataclass(frozen=True)
class Windows:
    tokens: np.ndarray  # [count, length] int64
    names: tuple[str, ...]  # the document of each window
    offsets: tuple[int, ...]  # its first token in that document
    loss_mask: np.ndarray | None = None  # [count, length - 1] bool: which predictions count; None: all
    objectives: tuple[str, ...] = ()  # each window's objective; () means perplexity for every window

    @property
    def content_hash(self) -> str:
        """sha256 of the token ids (and the loss mask where there is one): two jobs with the same hash scored the
        same predictions. Plain windows (no mask) hash their tokens alone."""
        digest = hashlib.sha256(np.ascontiguousarray(self.tokens, dtype=np.int64).tobytes())
        if self.loss_mask is not None:
            digest.update(np.packbits(self.loss_mask).tobytes())
        return digest.hexdigest()

    @property
    def window_objectives(self) -> tuple[str, ...]:
        return self.objectives or ("perplexity",) * len(self.tokens)

    def mask_or_all(self) -> np.ndarray:
        """The loss mask, all True where the windows have none."""
        if self.loss_mask is not None:
            return self.loss_mask
        return np.ones((self.tokens.shape[0], self.tokens.shape[1] - 1), dtype=bool)


def interleave_windows(parts: list[Windows]) -> Windows:
    """One set of windows from several of equal count (an objective mix), interleaved: window k of each part in
    order, then window k + 1 (the order `search.objective.ObjectiveMix.of` states); masks and objectives kept."""
    if len(parts) == 1:
        return parts[0]
    order = [(p, k) for k in range(len(parts[0].tokens)) for p in range(len(parts))]
    return Windows(
        tokens=np.stack([parts[p].tokens[k] for p, k in order]),
        names=tuple(parts[p].names[k] for p, k in order),
        offsets=tuple(parts[p].offsets[k] for p, k in order),
        loss_mask=np.stack([parts[p].mask_or_all()[k] for p, k in order]),
        objectives=tuple(parts[p].window_objectives[k] for p, k in order),
    )


def tail_mask(count: int, length: int, original_length: int) -> np.ndarray:
    """Predictions made at positions >= original_length (position t predicts token t + 1)."""
    mask = np.zeros((count, length - 1), dtype=bool)
    mask[:, original_length:] = True
    return mask


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


def windows_key(
    documents: list[TextDocument],
    tokenizer: TextTokenizer,
    *,
    length: int,
    count: int,
    seed: int,
    objective: str = "perplexity",
    original_length: int | None = None,
) -> str:
    """Plain perplexity windows keep the key they always had (existing caches stay valid)."""
    head = f"{tokenizer.identity}|{length}|{count}|{seed}"
    if objective == "tail":
        head += f"|tail|{original_length}"
    elif objective == "needle":
        head += f"|needle|{needle_format()}"
    digest = hashlib.sha256(head.encode())
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
    objective: str = "perplexity",
    original_length: int | None = None,
) -> Windows:
    """Windows for a job and one objective (`original_length` is where a tail starts), from the cache when the
    same inputs were tokenized before."""
    if objective not in OBJECTIVES:
        raise DataError(f"data.objective: unknown objective {objective!r}; expected one of {OBJECTIVES}")
    key = windows_key(
        documents,
        tokenizer,
        length=length,
        count=count,
        seed=seed,
        objective=objective,
        original_length=original_length,
    )
    cache_file = Path(cache_dir) / f"windows-{key}.npz" if cache_dir else None
    if cache_file and cache_file.is_file():
        cached = _read_cache(cache_file)
        if cached is not None:
            return cached
    token_docs, names = [tokenizer.encode(doc.text) for doc in documents], [doc.name for doc in documents]
    if objective == "needle":
        windows = _needle_windows(token_docs, names, tokenizer, length=length, count=count, seed=seed)
    else:
        windows = select_windows(token_docs, names, length=length, count=count, seed=seed)
    if objective == "tail":
        if original_length is None or not 0 < original_length < length - 1:
            raise DataError(f"data.objective: 'tail' needs original_length inside the window, got {original_length}")
        mask = tail_mask(count, length, original_length)
        windows = Windows(windows.tokens, windows.names, windows.offsets, mask, ("tail",) * count)
    if cache_file:
        _write_cache(cache_file, windows)
    return windows


def _needle_windows(
    token_docs: list[np.ndarray], names: list[str], tokenizer: TextTokenizer, *, length: int, count: int, seed: int
) -> Windows:
    needles, chosen, offsets = needle_windows(token_docs, tokenizer, length=length, count=count, seed=seed)
    return Windows(
        tokens=np.stack([needle.tokens for needle in needles]),
        names=tuple(names[i] for i in chosen),
        offsets=tuple(offsets),
        loss_mask=answer_mask(needles),
        objectives=("needle",) * count,
    )


def _read_cache(path: Path) -> Windows | None:
    """A damaged cache file is ignored (and rewritten), never trusted."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return Windows(
                tokens=data["tokens"],
                names=tuple(data["names"].tolist()),
                offsets=tuple(int(o) for o in data["offsets"]),
                loss_mask=data["loss_mask"].astype(bool) if "loss_mask" in data else None,
                objectives=tuple(data["objectives"].tolist()) if "objectives" in data else (),
            )
    except (OSError, ValueError, KeyError):
        return None


def _write_cache(path: Path, windows: Windows) -> None:
    """Written atomically (`atomic_file`); an OS error (a path under a file, disk full) is one DataError."""
    try:
        with atomic_file(path, "wb") as tmp:
            extra = {}
            if windows.loss_mask is not None:
                extra = {"loss_mask": windows.loss_mask, "objectives": np.array(windows.objectives, dtype=np.str_)}
            np.savez(
                tmp,
                tokens=windows.tokens,
                names=np.array(windows.names, dtype=np.str_),
                offsets=np.array(windows.offsets, dtype=np.int64),
                **extra,
            )
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise WindowsCacheError(f"cannot write the windows cache {str(path)!r} ({reason})") from exc
