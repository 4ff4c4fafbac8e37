"""Cheap checks first, on every path that resolves the model: `validate`, `search`, `compare` and `estimate` read the
data sources and measure their documents in bytes against the windows the config asks for, and check a `.gguf`
model's own file, before the model is resolved. Resolving a `.gguf` dequantizes it into the conversion cache (538 MB
and transformers' progress bars for SmolLM2), and only then are documents tokenized; a corpus whose documents have
fewer bytes than a window needs tokens cannot hold a window whatever the tokenizer (a token is at least one byte), so
it is refused in one line, with nothing converted or written."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_checks import cli_error_line
from tiny_gguf import tiny_gguf

from longrope.search.job.validation_checks import (
    LEAST_ORIGINAL_LENGTH,
    WindowTokens,
    compare_window_tokens,
    least_window_tokens,
)
from longrope.search.optimizers.factory import load_job_config

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "smollm2-135m-16k.yaml"  # 8192 -> 16384, 2 search windows
COMMANDS = ["validate", "search", "compare", "estimate"]
PROGRESS_BAR_TEXT = ("it/s", "%|", "de-quantizing", "Writing model shards")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny llama GGUF (tests/tiny_gguf.py): converting it is what must not happen."""
    return tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")[0]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """The conversion cache (`gguf_model.cache_root`), inside the test's folder: never the user's."""
    monkeypatch.setenv("LONGROPE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def documents(folder: Path, size: int, count: int = 1) -> Path:
    """A folder of `count` .txt documents of `size` bytes each."""
    folder.mkdir()
    for number in range(count):
        (folder / f"doc{number}.txt").write_text("ab" * (size // 2) + "a" * (size % 2))
    return folder


def argv(command: str, tmp_path: Path, model: Path, **sources: Path | str) -> list[str]:
    """`longrope COMMAND` on the shipped SmolLM2 16k config with `model` as model.path, writing under tmp_path."""
    overrides = {"model.path": model, "output_dir": tmp_path / "run"}
    overrides.update({f"data.{name}": value for name, value in sources.items()})
    args = [command, str(CONFIG)]
    for field, value in overrides.items():
        args += ["--set", f"{field}={value}"]
    return [*args, "--no-progress"] if command == "search" else args


def refused_before_conversion(args: list[str], tmp_path: Path, cache: Path, capsys, caplog) -> str:
    """The one error line, after checking that nothing was converted (the cache was never made) or written, and that
    no progress bar of a conversion reached stderr (`cli_error_line`: exactly one line there)."""
    capsys.readouterr()
    line = cli_error_line(args, capsys, caplog, folder=tmp_path)
    assert not cache.exists(), sorted(cache.rglob("*"))
    assert not any(text in line for text in PROGRESS_BAR_TEXT), line
    return line


@pytest.mark.parametrize("command", COMMANDS)
def test_a_corpus_shorter_than_a_window_is_refused_before_the_gguf_is_converted(
    command, tmp_path, tiny, cache, capsys, caplog
):
    """One 5,000-byte document for windows of 16,385 tokens, as search and test source: named by bytes, with the
    field and its value, before the GGUF is dequantized."""
    corpus = documents(tmp_path / "corpus", 5000)
    args = argv(command, tmp_path, tiny, search_source=corpus, test_source=corpus)
    line = refused_before_conversion(args, tmp_path, cache, capsys, caplog)
    assert line == (
        f"longrope: error: data.search_source = '{corpus}': 2 windows of 16385 tokens need 2 documents at least that "
        "long (a window never crosses two), found 0; the longest has 5000 bytes, fewer than a window's tokens"
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_a_test_source_shorter_than_the_target_is_refused_before_the_gguf_is_converted(
    command, tmp_path, tiny, cache, capsys, caplog
):
    """The search documents are long enough (the shipped corpus holds 8 of over 16k bytes); the test source's one
    document is not: compare reads it at the target, and `search` refuses it now, not after hours of scoring."""
    corpus = documents(tmp_path / "corpus", 5000)
    args = argv(command, tmp_path, tiny, search_source="corpus:test", test_source=corpus)
    line = refused_before_conversion(args, tmp_path, cache, capsys, caplog)
    assert line.startswith(f"longrope: error: data.test_source = '{corpus}': 16 windows of 16385 tokens need 16 ")
    assert line.endswith("found 0; the longest has 5000 bytes, fewer than a window's tokens"), line


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    "damage, named",
    [(lambda good: b"hello", "is not a GGUF file"), (lambda good: good[:-100], "truncated or damaged")],
    ids=["magic", "truncated"],
)
def test_a_gguf_that_cannot_be_read_is_named_before_anything_is_converted(
    command, damage, named, tmp_path, tiny, cache, capsys, caplog
):
    """The GGUF's own checks (its magic bytes, a whole file) come before the conversion, whichever command resolves
    the model; the data given is long enough, so the model is the one thing refused."""
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(damage(tiny.read_bytes()))
    args = argv(command, tmp_path, bad, search_source="corpus:test", test_source="corpus:test")
    line = refused_before_conversion(args, tmp_path, cache, capsys, caplog)
    assert line.startswith(f"longrope: error: model.path: '{bad}' ") and named in line, line


def test_a_staged_search_checks_its_last_stage_windows_before_the_first_stage_converts(
    tmp_path, tiny, cache, capsys, caplog
):
    """Documents of 14,000 bytes hold windows of the first stage (12,001 tokens) but not of the last (16,385): the
    whole job's data is checked before the first stage resolves its model."""
    corpus = documents(tmp_path / "corpus", 14000, count=2)
    args = [*argv("search", tmp_path, tiny, search_source=corpus, test_source="corpus:test")]
    line = refused_before_conversion([*args, "--set", "search.stages=[12000]"], tmp_path, cache, capsys, caplog)
    assert line == (
        f"longrope: error: data.search_source = '{corpus}': 2 windows of 16385 tokens need 2 documents at least that "
        "long (a window never crosses two), found 0; the longest has 14000 bytes, fewer than a window's tokens"
    )


def test_estimate_skips_data_that_is_not_on_this_machine(tmp_path, cache, capsys):
    """`estimate` prices a cluster's job where its data may not be: a source that is not here is not read (one that is
    here is checked, as above)."""
    from longrope.search.cli.main import main

    missing = tmp_path / "on-the-cluster"
    args = argv("estimate", tmp_path, "reference", search_source=missing, test_source=missing)
    args += ["--set", "original_length=null", "--set", "target_length=256"]
    assert main(args) == 0, capsys.readouterr().err


def test_the_window_bounds_known_before_the_model():
    """A long-factor search's windows are the target's; a short-factor search's are the original length's, known
    from the config when it gives one, else only the least a config may give (the model's own length needs the
    model); compare tunes on the search source at the target and tests at the longest length asked."""
    config = load_job_config(CONFIG)
    assert least_window_tokens(config) == WindowTokens(search=16385, test=16385)
    short_search = ["search.factor=short", "search.long_factors=factors.json", "search.optimizer=cmaes"]
    short = load_job_config(CONFIG, short_search)
    assert least_window_tokens(short) == WindowTokens(search=8193, test=16385)
    unknown = load_job_config(CONFIG, [*short_search, "original_length=null"])
    assert least_window_tokens(unknown) == WindowTokens(search=LEAST_ORIGINAL_LENGTH + 1, test=16385)
    assert compare_window_tokens(short, []) == WindowTokens(search=16385, test=16385)
    assert compare_window_tokens(config, [8192, 4096]) == WindowTokens(search=16385, test=8193)
