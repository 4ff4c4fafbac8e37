"""What `export`, `verify` and `compare` read and write: `export -o` writes through a symlink, to stdout
for `-`, in the format its extension names, and refuses a FIFO or an over-long name; `verify` and `compare` read a
factors file, a run directory or a model's weights and refuse a binary file, a FIFO, a truncated checkpoint or
factors of another model in one line; `compare` takes its job from a run directory and never writes into one.

Bad input is checked as in test_bad_input_cli.py (`cli_error_line`: exit 2, one `longrope: error:` line, nothing on
stdout, nothing written); compare runs with its worker pool replaced (no Ray): refused before the pool is built, or
scored by a deterministic fake."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from cli_checks import cli_error_line, longrope_block, snapshot, write_factors_file
from search_helpers import JOB_RECORD, known_problem_run

from longrope.search.cli.main import main
from longrope.search.reports.compare_plots import plot_factors
from longrope.search.reports.compare_rows import model_name
from longrope.workers.reference_recipe import reference_model_dir

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
REFERENCE = reference_model_dir()  # 16 rotary pairs, original length 128
LONG_NAME = "a" * 300  # past NAME_MAX (255 bytes on Linux filesystems)


# ---- helpers ----


def exportable_run(t: Path, name: str = "run", **job) -> Path:
    """A finished run with a job.json (JOB_RECORD: head_dim 32, original length 64, target 256, model 'm')."""
    run_dir = known_problem_run(t / name)
    (run_dir / "job.json").write_text(json.dumps({**JOB_RECORD, **job}))
    return run_dir


def reference_run(t: Path, name: str = "run") -> Path:
    """A finished run of the reference model (its default config: target 256) that compare can rerun."""
    return exportable_run(t, name, model_dir=str(REFERENCE), original_length=128, target_length=256)


def sparse(path: Path, size: int) -> Path:
    """A file of `size` NUL bytes that takes no disk space."""
    with path.open("wb") as out:
        out.truncate(size)
    return path


def written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def link(path: Path, target: str | Path) -> Path:
    path.symlink_to(target)
    return path


def reference_factors(path: Path, *, target: int = 1024, original: int = 128, **provenance) -> Path:
    """A factors file for the reference model's shape, searched (so its provenance says) for `target` tokens."""
    scale = target / original
    long_factor = [round(1.0 + (scale - 1.0) * i / 15, 3) for i in range(16)]
    block = longrope_block(long_factor, original=original, factor=scale, attention_factor=1.1)
    made = {"created_by": "longrope export", "method": "longrope-search", "method_rope_parameters": block}
    made.update({"model": str(REFERENCE), "original_length": original, "target_length": target, **provenance})
    return write_factors_file(path, block, max_position_embeddings=target, provenance=made)


def bent_factors(path: Path, pair: int, value: float, *, absolute: bool = False) -> Path:
    """`reference_factors` with one long factor changed: set to `value` (`absolute`), or scaled by it."""
    document = json.loads(reference_factors(path).read_text())
    factors = document["rope_parameters"]["long_factor"]
    factors[pair] = value if absolute else factors[pair] * value
    path.write_text(json.dumps(document))
    return path


def csv_export(t: Path) -> Path:
    """A CSV export (`export --format csv`) of a run of the reference model's shape: gd.csv and gd.csv.json."""
    run = exportable_run(t)
    assert main(["export", str(run), "-o", str(t / "gd.csv")]) == 0
    return t / "gd.csv"


def model_copy(t: Path, weights: bytes | None, name: str = "model") -> Path:
    """The reference model's config.json beside `weights` as model.safetensors (None: the whole real file)."""
    path = t / name
    path.mkdir()
    (path / "config.json").write_bytes((REFERENCE / "config.json").read_bytes())
    real = (REFERENCE / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(real if weights is None else weights)
    return path


def real_weights() -> bytes:
    return (REFERENCE / "model.safetensors").read_bytes()


def config_of(t: Path, model: Path) -> Path:
    path = t / "job.yaml"
    path.write_text(json.dumps({"target_length": 1024, "model": {"path": str(model)}, "data": {"tokenizer": "bytes"}}))
    return path  # JSON is YAML


def demo_compare(t: Path, *args: str) -> list[str]:
    """`longrope compare` on the demo config, small, results under t/out."""
    settings = [f"output_dir={t / 'out'}", "data.search_windows=2", "data.test_windows=4"]
    sets = [part for setting in settings for part in ("--set", setting)]
    return ["compare", str(CONFIGS / "demo.yaml"), *sets, "--lengths", "128,256", *args]


# ---- bad input: one line, nothing written ----

CASES = [
    # export -o: what is at the path decides, and the format
    pytest.param(
        lambda t: ["export", str(exportable_run(t)), "-o", str(fifo(t / "pipe"))],
        "pipe': a FIFO, not a regular file",
        id="export-to-fifo",
    ),
    pytest.param(
        lambda t: ["export", str(exportable_run(t)), "-o", str(link(t / "f.json", fifo(t / "pipe")))],
        "f.json': a symlink to a FIFO, not a regular file",
        id="export-to-link-to-fifo",
    ),
    pytest.param(
        lambda t: ["export", str(exportable_run(t)), "-o", str(link(t / "a.json", link(t / "b.json", "a.json")))],
        "a.json': a symlink loop",
        id="export-to-symlink-loop",
    ),
    pytest.param(
        lambda t: ["export", str(exportable_run(t)), "-o", str(t / LONG_NAME)],
        "': cannot write there (File name too long)",
        id="export-name-too-long",
    ),
    pytest.param(
        lambda t: ["export", str(exportable_run(t)), "-o", str(t / ("a" * 250 + ".csv"))],
        ".csv.json' (its sidecar): cannot write there (File name too long)",
        id="export-sidecar-name-too-long",
    ),
    pytest.param(
        lambda t: ["export", str(exportable_run(t)), "-o", str(t / "f.csv"), "--format", "json"],
        "--format json: -o '",
        id="export-json-into-csv-name",
    ),
    pytest.param(
        lambda t: ["export", str(exportable_run(t)), "-o", str(t / "f.json"), "--format", "csv"],
        "f.json' names a JSON file",
        id="export-csv-into-json-name",
    ),
    pytest.param(
        lambda t: ["export", str(exportable_run(t)), "-o", "-", "--format", "csv"],
        "-o -: a CSV export comes with a sidecar file",
        id="export-csv-to-stdout",
    ),
    # verify: what it reads
    pytest.param(
        lambda t: ["verify", str(written(t / "bin.json", b"\xff\xfe\x00binary" * 100)), "--model", str(REFERENCE)],
        "bin.json': not UTF-8 text (byte 0); is it a binary file?",
        id="verify-binary-file",
    ),
    pytest.param(
        lambda t: ["verify", str(fifo(t / "pipe")), "--model", str(REFERENCE)],
        "factors file '" + "{t}/pipe': a FIFO, not a regular file",
        id="verify-fifo",
    ),
    pytest.param(
        lambda t: ["verify", str(sparse(t / "big.json", 17 << 20)), "--model", str(REFERENCE)],
        "big.json': 17825792 bytes; a factors file is at most 16777216 bytes",
        id="verify-oversized-file",
    ),
    pytest.param(
        lambda t: ["verify", str((t / "d").mkdir() or t / "d"), "--model", str(REFERENCE)],
        "config.json: missing (is",
        id="verify-folder-that-is-no-run",
    ),
    pytest.param(
        lambda t: [
            "verify",
            str(reference_factors(t / "f.json")),
            "--model",
            str(model_copy(t, real_weights()[:1000])),
        ],
        "model.safetensors' is truncated: its header is 4024 bytes long, the file holds 992 after its length",
        id="verify-model-truncated-in-header",
    ),
    # verify refuses the factors that search and validate refuse (one check of long factors)
    pytest.param(
        lambda t: ["verify", str(bent_factors(t / "down.json", 5, 0.5)), "--model", str(REFERENCE), "--no-logits"],
        "down.json': rope_parameters.long_factor: factors must be non-decreasing, got",
        id="verify-decreasing-long-factor",
    ),
    pytest.param(
        lambda t: ["verify", str(bent_factors(t / "half.json", 0, 0.5, absolute=True)), "--model", str(REFERENCE)],
        "half.json': rope_parameters.long_factor: factors must be >= 1, got 0.5 at pair 0",
        id="verify-factor-below-one",
    ),
    pytest.param(
        lambda t: ["verify", str(bent_factors(t / "huge.json", 15, 1e300, absolute=True)), "--model", str(REFERENCE)],
        "huge.json': rope_parameters.long_factor: factors must be at most 10000, got 1e+300 at pair 15",
        id="verify-factor-1e300",
    ),
    # the file is named whatever is wrong with it; a CSV export points at its factors file
    pytest.param(
        lambda t: ["verify", str(csv_export(t)), "--model", str(REFERENCE)],
        "gd.csv': not valid JSON (Extra data at line 2); a CSV export: its factors file is '{t}/gd.csv.json' beside it",
        id="verify-csv-export-names-its-sidecar",
    ),
    # the weights' header, read by validate (and search) before anything is written
    pytest.param(
        lambda t: ["validate", str(config_of(t, model_copy(t, b"")))],
        "model.safetensors' is empty (0 bytes)",
        id="validate-empty-safetensors",
    ),
    pytest.param(
        lambda t: ["validate", str(config_of(t, model_copy(t, real_weights()[:-100])))],
        "model.safetensors' is truncated: its tensors need 3543552 bytes after the header, the file holds 3543452",
        id="validate-safetensors-truncated-in-data",
    ),
    pytest.param(
        lambda t: ["validate", str(config_of(t, model_copy(t, b"\x02\x00\x00\x00\x00\x00\x00\x00[]")))],
        "model.safetensors': its header is not a JSON object",
        id="validate-safetensors-header-not-an-object",
    ),
    pytest.param(
        lambda t: ["search", "--no-progress", str(config_of(t, model_copy(t, real_weights()[:-100])))],
        "model.safetensors' is truncated",
        id="search-safetensors-truncated",
    ),
]


@pytest.mark.parametrize(("make_args", "expected"), CASES)
def test_bad_input_is_one_line_and_writes_nothing(make_args, expected, tmp_path, capsys, caplog, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative default (runs/job) would land here, and be seen
    line = cli_error_line(make_args(tmp_path), capsys, caplog, folder=tmp_path)
    assert expected.replace("{t}", str(tmp_path)) in line


# ---- compare: refused before the pool is built ----


COMPARE_CASES = [
    # the file is named, whatever is wrong with it
    pytest.param(
        lambda t: demo_compare(t, "--factors", str(bent_factors(t / "f" / "neg.json", 3, -1.0, absolute=True))),
        "factors file '{t}/f/neg.json': rope_parameters.long_factor: factors must be >= 1, got -1.0 at pair 3",
        id="compare-negative-factor-names-the-file",
    ),
    pytest.param(
        lambda t: demo_compare(t, "--factors", str(written(t / "bin.json", b"\x89PNG\r\n\x1a\n" * 10))),
        "bin.json': not UTF-8 text (byte 0); is it a binary file?",
        id="compare-binary-factors",
    ),
    pytest.param(
        lambda t: demo_compare(t, "--factors", str(reference_factors(t / "f.json", model="/models/other-model"))),
        "f.json: made for model 'other-model' (provenance.model '/models/other-model'); this job's model is "
        "'reference_model'",
        id="compare-factors-of-another-model",
    ),
    pytest.param(
        lambda t: demo_compare(t, "--factors", str(reference_factors(t / "f.json", target=512, original=64))),
        "f.json: original length 64 (provenance.original_length), this job's is original_length (128)",
        id="compare-factors-of-another-original-length",
    ),
    pytest.param(
        lambda t: demo_compare(t, "--factors", str(exportable_run(t))),
        "run: original length 64 (provenance.original_length), this job's is original_length (128)",
        id="compare-run-of-another-model-shape",
    ),
    pytest.param(
        lambda t: ["compare", "--factors", str(reference_factors(t / "f.json"))],
        "compare: give a CONFIG, or a run directory as --factors (its config.json is the job)",
        id="compare-no-config-and-no-run-directory",
    ),
]


@pytest.mark.parametrize(("make_args", "expected"), COMPARE_CASES)
def test_compare_refuses_before_scoring(make_args, expected, tmp_path, capsys, caplog, monkeypatch, refusing_pool):
    monkeypatch.chdir(tmp_path)
    line = cli_error_line(make_args(tmp_path), capsys, caplog, folder=tmp_path)
    assert expected.replace("{t}", str(tmp_path)) in line


# ---- export -o: good paths ----


def test_export_writes_through_a_symlink_and_keeps_the_targets_mode(tmp_path, capsys):
    run = exportable_run(tmp_path)
    target = tmp_path / "kept" / "factors.json"
    target.parent.mkdir()
    target.write_text("old")
    target.chmod(0o640)
    out = link(tmp_path / "f.json", target)
    assert main(["export", str(run), "-o", str(out)]) == 0
    assert out.is_symlink() and os.readlink(out) == str(target), "the link stays a link"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert json.loads(target.read_text())["provenance"]["created_by"] == "longrope export"
    assert [p.name for p in target.parent.iterdir()] == ["factors.json"], "no temp file left beside the target"


def test_export_through_a_dangling_symlink_creates_its_target(tmp_path, capsys):
    run = exportable_run(tmp_path)
    out = link(tmp_path / "f.json", "made.json")
    assert main(["export", str(run), "-o", str(out)]) == 0
    assert out.is_symlink() and (tmp_path / "made.json").is_file()
    assert json.loads(out.read_text())["rope_parameters"]["rope_type"] == "longrope"


def test_export_to_dash_prints_the_json_and_creates_no_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = exportable_run(tmp_path)
    assert main(["export", str(run), "-o", str(tmp_path / "f.json")]) == 0
    capsys.readouterr()
    before = snapshot(tmp_path)
    assert main(["export", str(run), "-o", "-"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == json.loads((tmp_path / "f.json").read_text())
    assert snapshot(tmp_path) == before, "no file named '-'"
    assert "wrote" not in err


def test_export_takes_the_format_from_the_extension(tmp_path, capsys):
    run = exportable_run(tmp_path)
    out = tmp_path / "factors.CSV"
    assert main(["export", str(run), "-o", str(out)]) == 0
    factors = [float(line) for line in out.read_text().splitlines()]
    sidecar = json.loads((tmp_path / "factors.CSV.json").read_text())
    assert factors == sidecar["rope_parameters"]["long_factor"] and len(factors) == 16


def test_export_to_a_long_name_that_fits(tmp_path, capsys):
    """A 250-byte name is a legal file name; the temp file beside it must not be longer than NAME_MAX."""
    run = exportable_run(tmp_path)
    out = tmp_path / ("b" * 245 + ".json")
    assert main(["export", str(run), "-o", str(out)]) == 0
    assert json.loads(out.read_text())["max_position_embeddings"] == 256


# ---- verify RUN_DIR ----


def test_verify_reads_a_run_directory_as_compare_does(tmp_path, capsys):
    from conftest import save_tiny_llama

    model = save_tiny_llama(tmp_path / "model", max_position_embeddings=64, layers=1)
    run = exportable_run(tmp_path)
    assert main(["verify", str(run), "--model", str(model), "--no-logits", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["factors"] == str(run) and report["target_length"] == 256


# ---- compare: provenance and where the job and results come from ----


def written_directory(err: str) -> Path:
    last = err.strip().splitlines()[-1]
    assert last.startswith("compare: wrote "), last
    return Path(last.removeprefix("compare: wrote ").split("/ (")[0])


def test_factors_of_another_target_length_are_labelled_with_it(tmp_path, fake_pool, capsys):
    short = reference_factors(tmp_path / "f512.json", target=512)
    bare = tmp_path / "yarn.json"  # what `longrope encodings factors` writes: no provenance.model
    yarn = ["yarn", "--factor", "8", "--original-length", "128", "--head-dim", "32", "--target-length", "1024"]
    assert main(["encodings", "factors", *yarn]) == 0
    bare.write_text(capsys.readouterr().out)
    assert main(demo_compare(tmp_path, "--factors", str(short), "--factors", str(bare))) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "f512.json" in line]
    assert lines == [
        f"compare: --factors {short}: searched for 512 tokens (provenance.target_length), not this job's target "
        "(1024); its row is file:f512.json@512"
    ]
    unchecked = f"compare: --factors {bare}: no provenance.model (longrope encodings factors); its model is not checked"
    assert unchecked in err
    result = json.loads((written_directory(err) / "compare.json").read_text())
    assert {"file:f512.json@512", "file:f512.json@512 (vLLM)", "file:yarn.json"} <= set(result["methods"])
    assert result["methods"]["file:f512.json@512"]["factors_target_length"] == 512
    title = plot_factors(result).axes[0].get_title()
    assert "1024 tokens" in title and "@512: searched for 512" in title


def test_compare_takes_its_job_from_a_run_directory_and_writes_beside_it(tmp_path, fake_pool, capsys):
    run = reference_run(tmp_path / "runs")
    args = ["--set", "data.search_windows=2", "--set", "data.test_windows=4", "--lengths", "128,256"]
    before = snapshot(run)
    assert main(["compare", "--factors", str(run), *args]) == 0
    err = capsys.readouterr().err
    out = written_directory(err)
    assert out.parent == run.parent and out.name.startswith("run-compare-"), out
    assert f"compare: the job is {run}'s (its config.json)" in err
    result = json.loads((out / "compare.json").read_text())
    assert result["target_length"] == 256 and "run:run" in result["methods"]
    changed = {name for name in set(snapshot(run)) ^ set(before)}
    assert all(name.startswith("windows-cache") for name in changed), "only the job's windows cache"
    # a config whose output_dir is that run directory: the results go beside it as well
    assert main(demo_compare(tmp_path, "--set", f"output_dir={run}", "--factors", str(run))) == 0
    out = written_directory(capsys.readouterr().err)
    assert out.parent == run.parent and not any(p.name.startswith("compare") for p in run.iterdir())


def test_a_model_is_known_by_the_name_that_travels():
    """provenance.model is the path the search ran on; another machine holds the model elsewhere."""
    assert model_name("/tmp/democlone/workers/reference_model") == model_name(REFERENCE)
    cache = "/root/.cache/huggingface/hub/models--org--llama/snapshots/"
    assert model_name(cache + "abc") == model_name(cache + "def") == "models--org--llama"
    assert model_name("/models/llama-2-7b/") != model_name("/models/mistral-7b")
