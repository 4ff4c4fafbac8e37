"""bench/real_model.py's score log (bench/score_log.py), which multi-session tables resume from: one writer at a time
(a table and bench/search_split.py on one log would interleave lines and write the setup record over); a line cut by
a kill mid-write is dropped on the next start instead of stopping every later run with a JSON error, while a whole
line that lost only its newline is kept; and a reader (`table --partial`) reads beside a writer, changing nothing."""

from __future__ import annotations

import json

import pytest
from score_log import LogSetup, ScoreLog

from longrope.encodings.rope_methods.linear import LinearRope

SETUP = LogSetup(
    model="m",
    dtype="bfloat16",
    attn_implementation="sdpa",
    original_length=8,
    target_length=32,
    data_seed=0,
    search_source="s",
    test_source="t",
)


def test_a_second_writer_on_one_log_is_refused_until_the_first_ends(tmp_path):
    path = tmp_path / "x_scores.jsonl"
    first = ScoreLog(path, SETUP)
    first.add(("perplexity", 32, "yarn", "doc@0"), 10.0, 5, 1.0)
    with pytest.raises(SystemExit, match="in use by another bench run"):
        ScoreLog(path, SETUP)
    first._held.close()  # the process ends: the kernel drops its lock
    again = ScoreLog(path, SETUP)
    assert again.scores == {("perplexity", 32, "yarn", "doc@0"): (10.0, 5)}


def test_a_torn_last_line_is_dropped_and_the_next_score_starts_a_line_of_its_own(tmp_path, capsys):
    path = tmp_path / "x_scores.jsonl"
    log = ScoreLog(path, SETUP)
    log.add(("perplexity", 32, "yarn", "doc@0"), 10.0, 5, 1.0)
    log._held.close()
    with path.open("a") as out:
        out.write('{"set": "perplexity", "length": 32, "method": "pi", "win')  # a kill mid-write
    log = ScoreLog(path, SETUP)
    assert "dropping its torn last line" in capsys.readouterr().out
    assert list(log.scores) == [("perplexity", 32, "yarn", "doc@0")]
    log.add(("perplexity", 32, "pi", "doc@0"), 12.0, 5, 1.0)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(row["method"], row["nll"]) for row in rows] == [("yarn", 10.0), ("pi", 12.0)]


def test_a_last_line_that_lost_only_its_newline_is_kept(tmp_path):
    path = tmp_path / "x_scores.jsonl"
    row = {"set": "perplexity", "length": 32, "method": "yarn", "window": "doc@0", "nll": 10.0, "tokens": 5}
    path.write_text(json.dumps(row))  # a hand merge that lost the final newline
    log = ScoreLog(path, SETUP)
    assert log.scores == {("perplexity", 32, "yarn", "doc@0"): (10.0, 5)}
    log.add(("perplexity", 32, "pi", "doc@0"), 12.0, 5, 1.0)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(row["method"], row["nll"]) for row in rows] == [("yarn", 10.0), ("pi", 12.0)]


def test_a_reader_reads_beside_the_writer_and_changes_nothing(tmp_path):
    path = tmp_path / "x_scores.jsonl"
    writer = ScoreLog(path, SETUP)
    writer.add(("perplexity", 32, "yarn", "doc@0"), 10.0, 5, 1.0)
    writer.check_methods({})
    with path.open("a") as out:
        out.write('{"set": "perplexity", "length": 32, "method": "pi", "win')  # the writer mid-line
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    reader = ScoreLog(path, SETUP, read_only=True)
    assert reader.scores == {("perplexity", 32, "yarn", "doc@0"): (10.0, 5)}
    with pytest.raises(RuntimeError, match="read only"):
        reader.add(("perplexity", 32, "pi", "doc@0"), 12.0, 5, 1.0)
    reader.check_methods({"ntk": SETUP})  # a label new to the log: not recorded by a reader
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files


def test_a_method_applying_the_same_numbers_takes_its_twins_score_and_names_it(tmp_path):
    """Two PI methods that differ only in the length they declare apply the same frequencies at 32 tokens: the
    second is not scored again but logged with the first's score, and the table's line names the first."""
    shape = {"head_dim": 8, "rope_theta": 10000.0}
    methods = {
        "pi": LinearRope(max_position_embeddings=32, factor=4.0, **shape),
        "pi declared longer": LinearRope(max_position_embeddings=64, factor=4.0, **shape),
        "pi x2": LinearRope(max_position_embeddings=32, factor=2.0, **shape),
    }
    log = ScoreLog(tmp_path / "x_scores.jsonl", SETUP)
    log.check_methods(methods)
    log.add(("perplexity", 32, "pi", "doc@0"), 10.0, 5, 1.0)
    assert log.copied_twin(("perplexity", 32, "pi declared longer", "doc@0"), methods) == "pi"
    assert log.scores[("perplexity", 32, "pi declared longer", "doc@0")] == (10.0, 5)
    assert log.copied_twin(("perplexity", 32, "pi x2", "doc@0"), methods) is None  # other frequencies
    assert log.copied_twin(("perplexity", 32, "pi declared longer", "doc@1"), methods) is None  # no score there yet
