"""Needle windows: a document with a number hidden in it and a question at the end; only the answer counts.

LongRoPE2 (Shang et al. 2025, arXiv 2502.20082, section 3.3; microsoft/LongRoPE `evolution/search.py`, needle
perplexity) scores candidates by the NLL of retrieving a needle instead of plain perplexity: the text of a
document cut to the window, a key sentence carrying a random 7-digit number inserted at a break (newline)
nearest a depth, a preamble saying a number is hidden, and at the end a question sentence followed by the
number. Every label but the answer number's tokens is ignored, so the loss is the NLL of the retrieval.

The pieces are tokenized one by one and concatenated, so the answer's tokens are known exactly with any
tokenizer (bytes or a model's own); a window is exactly `length` tokens, the answer its last tokens. The
answer is " " + number (the question ends before the space), which a BPE tokenizer splits as it splits the
number inside the key sentence (" 2", "5", ...), so the needle holds the very tokens the answer must copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from longrope.workers.errors import DataError
from longrope.workers.tokenization import TextTokenizer

# Short on purpose: at the reference model's 128 bytes the haystack must still hold text.
PREAMBLE = "A number is hidden in this text.\n"
KEY_SENTENCE = "\nThe number is {number}.\n"
QUESTION = "\nWhat is the number? The number is"
ANSWER = " {number}"
NUMBER_LOW, NUMBER_HIGH = 1_000_000, 10_000_000  # 7 digits
NUMBER_SLACK = 8  # document tokens kept beyond the room of the longest number


@dataclass(frozen=True)
class Needle:
    """One needle window: its tokens, where the answer starts, and what was hidden where."""

    tokens: np.ndarray  # [length] int64
    answer_start: int  # index of the answer's first token; the answer runs to the end of the window
    number: str
    depth: float  # the depth asked for, in [0, 1]
    key_start: int  # index of the key sentence's first token


def depth_spread(count: int) -> list[float]:
    """`count` depths spread evenly over [0, 1] (the official example uses (i + 10 j) / 99 for 10 x 10)."""
    return [0.5] if count == 1 else [k / (count - 1) for k in range(count)]


def needle_overhead(tokenizer: TextTokenizer) -> int:
    """Tokens a needle window spends on anything but the document (the longest number's tokens included)."""
    number = "9" * len(str(NUMBER_HIGH - 1))
    pieces = (PREAMBLE, KEY_SENTENCE.format(number=number), QUESTION, ANSWER.format(number=number))
    return sum(len(tokenizer.encode(piece)) for piece in pieces)


def make_needle(haystack: np.ndarray, tokenizer: TextTokenizer, *, length: int, depth: float, number: str) -> Needle:
    """A window of `length` tokens: preamble, the start of `haystack` with the key sentence inserted after the
    break nearest `depth` of it, the question, the answer. `haystack` must hold enough tokens."""
    pre, key = tokenizer.encode(PREAMBLE), tokenizer.encode(KEY_SENTENCE.format(number=number))
    question, answer = tokenizer.encode(QUESTION), tokenizer.encode(ANSWER.format(number=number))
    room = length - len(pre) - len(key) - len(question) - len(answer)
    if room < 1:
        raise DataError(
            f"data: a needle needs more than {length - room} tokens of a {length}-token window for its preamble, "
            "key sentence, question and answer; use longer windows"
        )
    if len(haystack) < room:
        raise DataError(f"data: a needle window needs {room} document tokens, the document has {len(haystack)}")
    text = haystack[:room]
    cut = _break_nearest(text, tokenizer, depth)
    tokens = np.concatenate([pre, text[:cut], key, text[cut:], question, answer]).astype(np.int64)
    return Needle(tokens, len(tokens) - len(answer), number, depth, len(pre) + cut)


def _break_nearest(text: np.ndarray, tokenizer: TextTokenizer, depth: float) -> int:
    """The index just after the newline token nearest `depth` of `text` (the depth itself when none). Depth 0
    lands after the first line break, not before the text: the shipped reference model was trained so, and
    its recipe must reproduce it."""
    target = round(depth * len(text))
    breaks = np.flatnonzero(tokenizer.newline_mask(text)) + 1
    if len(breaks) == 0:
        return target
    return int(breaks[np.argmin(np.abs(breaks - target))])


def answer_mask(needles: list[Needle]) -> np.ndarray:
    """[count, length - 1] bool: the predictions of each needle's answer tokens (position t predicts token t + 1),
    the loss mask of a needle window."""
    mask = np.zeros((len(needles), len(needles[0].tokens) - 1), dtype=bool)
    for row, needle in enumerate(needles):
        mask[row, needle.answer_start - 1 :] = True
    return mask


def needle_format() -> str:
    """The templates' identity, part of the windows cache key: changed templates never reuse old windows."""
    return "|".join((PREAMBLE, KEY_SENTENCE, QUESTION, ANSWER))


def needle_windows(
    token_docs: list[np.ndarray],
    tokenizer: TextTokenizer,
    *,
    length: int,
    count: int,
    seed: int,
    depths: list[float] | None = None,
) -> tuple[list[Needle], list[int], list[int]]:
    """`count` needles, one per document long enough, documents and offsets drawn by `seed`, depths spread
    evenly (or `depths`, cycled), numbers drawn by `seed`. Returns the needles, their documents and offsets."""
    overhead = needle_overhead(tokenizer)
    room = length - overhead
    if room < 1:
        raise DataError(
            f"data.objective: a needle needs {overhead} tokens for its preamble, key sentence, question and answer; "
            f"windows of {length} tokens leave no room for the document"
        )
    room += NUMBER_SLACK  # a number may take fewer tokens than the longest one; the window still fills
    eligible = [i for i, doc in enumerate(token_docs) if len(doc) >= room]
    if len(eligible) < count:
        raise DataError(f"data: need {count} documents of at least {room} tokens for needles, found {len(eligible)}")
    rng = np.random.default_rng([seed, 7])  # its own stream: the plain windows of the same seed are unchanged
    chosen = sorted(rng.permutation(eligible)[:count].tolist())
    offsets = [int(rng.integers(0, len(token_docs[i]) - room + 1)) for i in chosen]
    numbers = [str(int(n)) for n in rng.integers(NUMBER_LOW, NUMBER_HIGH, size=count)]
    spread = depths or depth_spread(count)
    needles = [
        make_needle(token_docs[i][o:], tokenizer, length=length, depth=spread[k % len(spread)], number=numbers[k])
        for k, (i, o) in enumerate(zip(chosen, offsets, strict=True))
    ]
    return needles, chosen, offsets
