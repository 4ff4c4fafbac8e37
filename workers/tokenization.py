"""Tokenizers for scoring: the model's own (transformers AutoTokenizer from the model directory) or bytes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from longrope.workers.byte_tokenizer import decode_bytes, encode_bytes
from longrope.workers.errors import DataError

BYTE_TOKENIZER = "bytes"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "merges.txt")


class TextTokenizer:
    """`encode(text) -> int64 ids` without special tokens, plus an `identity` that keys the window cache."""

    def __init__(self, source: str | Path, *, trust_remote_code: bool = False):
        self.source = str(source)
        if self.source == BYTE_TOKENIZER:
            self._encode = encode_bytes
            self._decode = decode_bytes
            self.identity = BYTE_TOKENIZER
            return
        from transformers import AutoTokenizer  # transformers: only for a model's own tokenizer; bytes need none

        try:
            tokenizer = AutoTokenizer.from_pretrained(
                self.source, local_files_only=True, trust_remote_code=trust_remote_code
            )
        except (OSError, ValueError) as exc:
            raise DataError(f"tokenizer: cannot load one from {self.source!r}: {exc}") from exc
        self._encode = lambda text: np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
        self._decode = lambda ids: tokenizer.decode([int(i) for i in ids])
        self.identity = _files_hash(Path(self.source))

    def encode(self, text: str) -> np.ndarray:
        return self._encode(text)

    def decode(self, ids: np.ndarray) -> str:
        return self._decode(ids)

    def newline_mask(self, ids: np.ndarray) -> np.ndarray:
        """Which tokens hold a line break (where a needle may be inserted), each distinct id decoded alone."""
        ids = np.asarray(ids, dtype=np.int64)
        breaking = [u for u in np.unique(ids).tolist() if "\n" in self._decode(np.array([u]))]
        return np.isin(ids, breaking)


def _files_hash(model_dir: Path) -> str:
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = model_dir / name
        if path.is_file():
            digest.update(name.encode() + path.read_bytes())
    return "hf:" + digest.hexdigest()[:16]
