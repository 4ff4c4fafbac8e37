"""Long documents from local files, or from the embedded corpus, as (name, text) pairs.

Formats: plain text (one document per file), JSONL (one document per line, in a `text` field) and parquet
(one per row, through pyarrow). A directory is read recursively in sorted order, so the same folder gives the
same documents on every machine. Source `corpus:<split>` is the embedded corpus (see `corpus`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from longrope.workers.corpus import SPLITS, corpus_documents
from longrope.workers.errors import DataError

TEXT_SUFFIXES = frozenset({".txt", ".md", ".rst", ".py", ".tex", ".text"})
CORPUS_PREFIX = "corpus:"


@dataclass(frozen=True)
class TextDocument:
    name: str
    text: str


def read_source(source: str, *, text_field: str = "text") -> list[TextDocument]:
    """All documents of one source: `corpus:<split>`, a file, or a folder of files."""
    if source.startswith(CORPUS_PREFIX):
        split = source.removeprefix(CORPUS_PREFIX)
        if split not in SPLITS:
            raise DataError(f"data source: unknown corpus split {split!r}; expected one of {SPLITS}")
        return [TextDocument(doc.name, doc.text) for doc in corpus_documents(split)]
    path = Path(source)
    if not path.exists():
        raise DataError(f"data source: {source!r} does not exist")
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    documents = [doc for file in files if _readable(file) for doc in read_file(file, text_field=text_field)]
    if not documents:
        raise DataError(f"data source: {source!r} holds no .txt/.md/.jsonl/.parquet documents")
    return documents


def _readable(path: Path) -> bool:
    return path.suffix in TEXT_SUFFIXES or path.suffix in (".jsonl", ".parquet")


def read_file(path: Path, *, text_field: str = "text") -> list[TextDocument]:
    if path.suffix == ".jsonl":
        return _read_jsonl(path, text_field)
    if path.suffix == ".parquet":
        return _read_parquet(path, text_field)
    try:
        return [TextDocument(str(path), path.read_text(encoding="utf-8"))]
    except UnicodeDecodeError as exc:
        raise DataError(f"data file: {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc


def _read_jsonl(path: Path, text_field: str) -> list[TextDocument]:
    documents = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"data file: {path}:{number} is not valid JSON ({exc.msg})") from exc
            text = record.get(text_field) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise DataError(f"data file: {path}:{number} has no string field {text_field!r}")
            documents.append(TextDocument(f"{path}:{number}", text))
    return documents


def _read_parquet(path: Path, text_field: str) -> list[TextDocument]:
    import pyarrow.parquet as pq  # pyarrow: an optional extra, needed only for .parquet sources

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise DataError(f"data file: {str(path)!r} is not a readable parquet file ({exc})") from exc
    if text_field not in table.column_names:
        raise DataError(f"data file: {str(path)!r} has no column {text_field!r} (columns: {table.column_names})")
    texts = table.column(text_field).to_pylist()
    return [TextDocument(f"{path}#{row}", text) for row, text in enumerate(texts) if isinstance(text, str)]
