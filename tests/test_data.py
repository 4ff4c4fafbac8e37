"""Documents from files and the embedded corpus, fixed windows, and the window cache."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import save_tiny_llama

from longrope.workers.byte_tokenizer import decode_bytes, encode_bytes
from longrope.workers.corpus import SPLITS, corpus_documents, split_of
from longrope.workers.documents import TextDocument, read_source
from longrope.workers.errors import DataError
from longrope.workers.tokenization import TextTokenizer
from longrope.workers.windows import load_windows, select_windows


def test_byte_tokenizer_round_trips():
    text = "def f(x):\n    return x ** 2  # naïve ✓"
    ids = encode_bytes(text)
    assert ids.dtype == np.int64 and ids.max() < 256 and len(ids) == len(text.encode())
    assert decode_bytes(ids) == text


def test_corpus_splits_share_no_package():
    units = {split: {split_of(doc.unit) for doc in corpus_documents(split)} for split in SPLITS}
    assert all(found == {split} for split, found in units.items())
    names = [{doc.unit for doc in corpus_documents(split)} for split in SPLITS]
    assert not (names[0] & names[1] or names[0] & names[2] or names[1] & names[2])
    assert sum(len(corpus_documents(s)) for s in SPLITS) > 500
    assert corpus_documents("test") == corpus_documents("test")  # deterministic order


def test_reads_text_jsonl_and_parquet(tmp_path):
    (tmp_path / "a.txt").write_text("plain text document")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "first"}) + "\n\n" + json.dumps({"text": "second"}) + "\n")
    pq.write_table(pa.table({"text": ["row zero", "row one"], "id": [0, 1]}), tmp_path / "c.parquet")
    (tmp_path / "ignored.bin").write_bytes(b"\x00\x01")
    docs = read_source(str(tmp_path))
    assert [d.text for d in docs] == ["plain text document", "first", "second", "row zero", "row one"]
    assert docs[2].name.endswith("b.jsonl:3")


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.jsonl", '{"text": "ok"}\n{not json\n', r"bad\.jsonl:2 is not valid JSON"),
        ("field.jsonl", '{"body": "no text field"}\n', r"field\.jsonl:1 has no string field 'text'"),
        ("broken.parquet", "not parquet at all", r"broken\.parquet' is not a readable parquet file"),
        ("latin.txt", b"caf\xe9", r"latin\.txt' is not UTF-8 text"),
    ],
)
def test_bad_data_files_name_file_and_line(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(DataError, match=message):
        read_source(str(path))


def test_missing_sources_and_columns(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        read_source(str(tmp_path / "nothing"))
    with pytest.raises(DataError, match="unknown corpus split 'dev'"):
        read_source("corpus:dev")
    pq.write_table(pa.table({"content": ["x"]}), tmp_path / "c.parquet")
    with pytest.raises(DataError, match=r"has no column 'text' \(columns: \['content'\]\)"):
        read_source(str(tmp_path / "c.parquet"))


def test_windows_are_fixed_by_seed_and_one_per_document():
    docs = [np.arange(n, dtype=np.int64) + 1000 * i for i, n in enumerate((50, 300, 20, 400, 1000, 99))]
    names = [f"d{i}" for i in range(len(docs))]
    first = select_windows(docs, names, length=100, count=3, seed=7)
    again = select_windows(docs, names, length=100, count=3, seed=7)
    assert np.array_equal(first.tokens, again.tokens) and (first.names, first.offsets) == (again.names, again.offsets)
    assert len(set(first.names)) == 3 and set(first.names) <= {"d1", "d3", "d4"}
    for tokens, name, offset in zip(first.tokens, first.names, first.offsets, strict=True):
        np.testing.assert_array_equal(tokens, docs[names.index(name)][offset : offset + 100])
    other = select_windows(docs, names, length=100, count=3, seed=8)
    assert other.content_hash != first.content_hash


def test_too_few_long_documents_says_what_was_found():
    docs = [np.zeros(n, dtype=np.int64) for n in (10, 200, 150)]
    with pytest.raises(
        DataError,
        match=r"need 3 documents of at least 100 tokens, found 2 \(of 3 documents; "
        r"the longest has 200 tokens\)",
    ):
        select_windows(docs, ["a", "b", "c"], length=100, count=3, seed=0)


def test_window_cache_is_keyed_by_content(tmp_path):
    tokenizer = TextTokenizer("bytes")
    docs = [TextDocument(f"d{i}", "x" * 50 + str(i) * 300) for i in range(4)]
    first = load_windows(docs, tokenizer, length=64, count=2, seed=1, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("windows-*.npz"))) == 1
    cached = load_windows(docs, tokenizer, length=64, count=2, seed=1, cache_dir=tmp_path)
    np.testing.assert_array_equal(cached.tokens, first.tokens)
    assert (cached.names, cached.offsets) == (first.names, first.offsets)
    changed = [TextDocument("d0", "y" * 400), *docs[1:]]
    load_windows(changed, tokenizer, length=64, count=2, seed=1, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("windows-*.npz"))) == 2
    for path in tmp_path.glob("windows-*.npz"):  # a damaged cache file is rebuilt, not trusted
        path.write_bytes(b"garbage")
    rebuilt = load_windows(docs, tokenizer, length=64, count=2, seed=1, cache_dir=tmp_path)
    np.testing.assert_array_equal(rebuilt.tokens, first.tokens)


def test_model_tokenizer_from_model_directory(tmp_path):
    """AutoTokenizer from a model directory (a small tokenizer built here; nothing is downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "long": 3}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    model_dir = save_tiny_llama(tmp_path / "model")
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]").save_pretrained(model_dir)
    tokenizer = TextTokenizer(model_dir)
    np.testing.assert_array_equal(tokenizer.encode("hello long world zzz"), [1, 3, 2, 0])
    assert tokenizer.identity.startswith("hf:")
    with pytest.raises(DataError, match="tokenizer: cannot load one"):
        TextTokenizer(tmp_path / "missing")
