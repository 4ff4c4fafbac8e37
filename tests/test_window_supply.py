"""A data source holds a document for each window it is asked for: `validate` says so before any search, in one
line naming the field, with nothing written (a 32k config on a corpus of 16k documents; too few long documents; a
document one token short of the window). The reference model reads bytes, one token each, so every count here is
worked by hand from the documents' lengths."""

from __future__ import annotations

import json

import pytest
from cli_checks import cli_error_line

from longrope.search.cli.main import main
from longrope.search.job.validation_checks import window_bytes_check, window_supply_check
from longrope.workers.documents import TextDocument
from longrope.workers.errors import DataError

TARGET = 1024  # the reference model's 128 x 8: a window reads TARGET + 1 tokens (TARGET predictions)


def job(tmp_path, search_docs: list[int], test_docs: list[int], windows: int = 2) -> list[str]:
    """`validate` of a job on two folders of documents of the given byte (= token) lengths."""
    for split, sizes in (("search", search_docs), ("test", test_docs)):
        folder = tmp_path / split
        folder.mkdir()
        for number, size in enumerate(sizes):
            (folder / f"d{number}.txt").write_text("ab" * (size // 2) + "a" * (size % 2))
    config = tmp_path / "job.yaml"
    config.write_text(
        f"target_length: {TARGET}\noutput_dir: {tmp_path / 'run'}\n"
        f"data: {{search_source: {tmp_path / 'search'}, test_source: {tmp_path / 'test'}, "
        f"search_windows: {windows}, test_windows: {windows}}}\n"
    )
    return ["validate", str(config)]


def test_enough_long_documents_pass_and_each_check_is_listed(tmp_path, capsys):
    assert main([*job(tmp_path, [TARGET + 1, 5000, 10], [TARGET + 1] * 2), "--json"]) == 0
    checks = {check["what"]: check for check in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["data.search_source windows"]["detail"] == "2 documents of >= 1025 tokens found, a window each"
    assert checks["data.test_source windows"]["result"] == "ok"


@pytest.mark.parametrize(
    ("search_docs", "test_docs", "expected"),
    [
        pytest.param(
            [5000, 300],
            [2000, 2000],
            "data.search_source = '{search}': 2 windows of 1025 tokens need 2 documents at least that long (a "
            "window never crosses two), found at most 1; the others have fewer bytes than a window's tokens",
            id="too-few-long-documents",
        ),
        pytest.param(
            [5000, 5000],
            [2000, TARGET],
            "data.test_source = '{test}': 2 windows of 1025 tokens need 2 documents at least that long (a window "
            "never crosses two), found at most 1; the others have fewer bytes than a window's tokens",
            id="one-token-short",
        ),
        pytest.param(
            [900, 800],
            [2000, 2000],
            "data.search_source = '{search}': 2 windows of 1025 tokens need 2 documents at least that long (a "
            "window never crosses two), found 0; the longest has 900 bytes, fewer than a window's tokens",
            id="all-shorter-than-a-window",
        ),
    ],
)
def test_too_few_documents_for_the_windows_is_one_line(tmp_path, capsys, caplog, search_docs, test_docs, expected):
    args = job(tmp_path, search_docs, test_docs)
    line = cli_error_line(args, capsys, caplog, folder=tmp_path)
    assert line == "longrope: error: " + expected.format(search=tmp_path / "search", test=tmp_path / "test")


class PairTokenizer:
    """Two bytes a token, as a BPE tokenizer reads plain text (the reference model's bytes cannot tell the check that
    tokenizes from the one that counts bytes); counts the documents it was asked to tokenize."""

    def __init__(self):
        self.encoded: list[int] = []

    def encode(self, text: str):
        self.encoded.append(len(text))
        return list(range(len(text) // 2))


def test_documents_long_enough_in_bytes_are_then_tokenized_longest_first():
    """Bytes first: the 900-byte document is never tokenized (it cannot hold 1025 tokens); the two long enough in
    bytes are, and only one holds a window, which is then what the line says."""
    documents = [TextDocument(f"d{size}", "a" * size) for size in (900, 3000, 2000)]
    tokenizer = PairTokenizer()
    with pytest.raises(DataError) as caught:
        window_supply_check("data.search_source", "s", documents, tokenizer, length=TARGET + 1, count=2)
    assert str(caught.value).endswith("found 1; the longest has 1500 tokens")
    assert tokenizer.encoded == [3000, 2000]
    with pytest.raises(DataError, match="found at most 1; the others have fewer bytes than a window's tokens"):
        window_bytes_check("data.search_source", "s", documents[:2], length=TARGET + 1, count=2)
    with pytest.raises(DataError, match="found at most 1; no others"):
        window_bytes_check("data.search_source", "s", documents[1:2], length=TARGET + 1, count=2)
