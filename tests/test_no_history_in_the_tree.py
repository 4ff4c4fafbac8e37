"""Code and docs say what is, not how it came to be: no commit id and no issue number in the prose of the package,
the tests, the docs, the configs or the README (the history is `git log`'s).

Prose is what a reader reads as text: a .py file's comments and docstrings (string literals are data: a test's
candidate key or hash is not history), a YAML file's comments, and a Markdown file whole but for code spans and
blocks (a run's keys and hashes shown as output). A commit id is a word of 7 to 40 hex digits holding a digit and
a letter; an issue number is the word issue followed by a number, with or without a hash sign."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("search", "encodings", "workers", "tests", "docs", "configs")
COMMIT = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)


def python_prose(text: str) -> str:
    """A module's comments and docstrings (every string literal that stands alone as a statement)."""
    prose, previous = [], tokenize.NEWLINE
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        standalone = previous in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
        if token.type == tokenize.COMMENT or (token.type == tokenize.STRING and standalone):
            prose.append(token.string)
        if token.type not in (tokenize.NL, tokenize.COMMENT):
            previous = token.type
    return "\n".join(prose)


def prose_of(path: Path) -> str:
    text = path.read_text()
    if path.suffix == ".py":
        return python_prose(text)
    if path.suffix in (".yaml", ".yml", ".toml"):
        return "\n".join(line.partition("#")[2] for line in text.splitlines())
    return CODE.sub("", text)


def prose_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for folder in FOLDERS:
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md", ".yaml", ".yml")]
    return sorted(p for p in files if "fixtures" not in p.parts and p.is_file())


def history_in(path: Path) -> list[str]:
    prose = prose_of(path)
    return [match.group() for pattern in (COMMIT, ISSUE) for match in pattern.finditer(prose)]


def test_no_commit_id_or_issue_number_in_the_prose():
    found = {str(path.relative_to(ROOT)): hits for path in prose_files() if (hits := history_in(path))}
    assert not found, found


@pytest.mark.parametrize(
    ("text", "hits"),
    [
        ('"""Code before 447a254 wrote it."""\nx = "4842eb65617685915e4e"\n', ["447a254"]),
        ("# see issue 20, item 4\nkey = 'abcdef0123'\n", ["issue 20"]),
        ('def f():\n    """Fixed in issue #7."""\n    return "d3b9b7d"\n', ["issue #7"]),
        ('"""A 0.25 share and deadbeef are not commits: no digit in one, no letter in 1234567."""\n', []),
    ],
)
def test_the_check_reads_prose_not_data(tmp_path, text, hits):
    path = tmp_path / "module.py"
    path.write_text(text)
    assert history_in(path) == hits
