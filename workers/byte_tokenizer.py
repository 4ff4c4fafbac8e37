"""The byte-level tokenizer of the reference model: token id = byte value, vocabulary of 256.

No special tokens and no merges, so any text round-trips and the embedded corpus needs nothing downloaded.
"""

from __future__ import annotations

import numpy as np

BYTE_VOCAB_SIZE = 256


def encode_bytes(text: str) -> np.ndarray:
    """UTF-8 bytes of `text` as int64 token ids."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)


def decode_bytes(ids: np.ndarray) -> str:
    return bytes(np.asarray(ids, dtype=np.uint8).tolist()).decode("utf-8", errors="replace")
