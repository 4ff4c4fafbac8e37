"""Bad files and folders given to the `longrope` CLI (factors files, run directories, model directories), run in-process
through `main(argv)`: exit code 2, exactly one line on stderr naming the file and what is wrong, nothing on stdout,
and nothing written under the test's folder. The configs and values are in test_bad_input_cli.py.

The reference model (`model.path: reference`) has original length 128 and 16 rotary pairs; the cheap run
directory (bench/known_problem.py) has head_dim 32, original length 64 and target length 256.
"""

from __future__ import annotations

import json

import pytest
from bad_input_helpers import (
    LLAMA,
    base,
    deleted,
    drop_key_of_line,
    edit_run,
    edited_hash,
    exportable_run,
    factors,
    model_dir,
    model_search,
    replace_line,
    search,
    write,
)
from cli_checks import cli_error_line
from search_helpers import known_problem_run

# ---- the table: id -> (argv builder, a substring of the one error line) ----

CASES = [
    # 3. `longrope encodings factors`
    pytest.param(
        lambda t: factors("yarn", "--factor", "1e308", "--original-length", "128", "--head-dim", "32"),
        "--factor: must be a finite number in (0, 10000], got 1e+308",
        id="factors-factor-1e308",
    ),
    pytest.param(
        lambda t: factors(
            "yarn",
            "--factor",
            "4",
            "--original-length",
            "128",
            "--head-dim",
            "32",
            "--beta-fast",
            "1",
            "--beta-slow",
            "32",
        ),
        "--beta-fast: must be greater than beta_slow (32), got 1",
        id="factors-beta-fast-below-slow",
    ),
    pytest.param(
        lambda t: factors("pi", "--factor", "4", "--original-length", "0", "--head-dim", "32"),
        "--original-length: must be greater than 0, got 0",
        id="factors-original-length-zero",
    ),
    pytest.param(
        lambda t: factors(
            "pi", "--factor", "4", "--original-length", "128", "--head-dim", "32", "--target-length", str(2**26 + 1)
        ),
        f"--target-length: must be at most {2**26} tokens, got {2**26 + 1}",
        id="factors-target-length-over-max",
    ),
    pytest.param(
        lambda t: factors("frobnicate", "--original-length", "128", "--head-dim", "32"),
        "method: unknown value 'frobnicate'",
        id="factors-unknown-method",
    ),
    pytest.param(
        lambda t: factors("yarn", "--factor", "4", "--original-length", "128", "--head-dim", "32", "--param", "mscale"),
        "--param: expected KEY=VALUE, got 'mscale'",
        id="factors-param-without-equals",
    ),
    # 4. run directories
    pytest.param(lambda t: ["status", str(t)], "config.json: missing (is", id="status-no-config"),
    pytest.param(
        lambda t: ["status", str(edit_run(t, "config.json", lambda text: json.dumps([json.loads(text)])))],
        "config.json: not a run config (a JSON list)",
        id="status-config-json-list",
    ),
    pytest.param(
        lambda t: ["status", str(edit_run(t, "config.json", lambda text: "config_hash = 1\n"))],
        "config.json: corrupted (Expecting value",
        id="status-config-not-json",
    ),
    pytest.param(
        lambda t: ["status", str(edit_run(t, "config.json", edited_hash))],
        "config.json: config_hash does not match its config",
        id="status-config-hash-edited",
    ),
    pytest.param(
        lambda t: ["status", str(edit_run(t, "history.jsonl", lambda text: replace_line(text, 2, "{not json")))],
        "history.jsonl:3: corrupted line (not JSON)",
        id="status-history-line-not-json",
    ),
    pytest.param(
        lambda t: ["status", str(edit_run(t, "history.jsonl", lambda text: replace_line(text, 2, "[1, 2]")))],
        "history.jsonl:3: corrupted line (a JSON list, not an object)",
        id="status-history-line-list",
    ),
    pytest.param(
        lambda t: ["status", str(edit_run(t, "history.jsonl", lambda text: drop_key_of_line(text, 2)))],
        "history.jsonl:3: corrupted line (key: Field required)",
        id="status-history-line-without-key",
    ),
    pytest.param(
        lambda t: [
            "search",
            "--no-progress",
            "--resume",
            str(deleted(known_problem_run(t / "run") / "history.jsonl").parent),
        ],
        "history.jsonl: holds no scored candidate, but state.json has reached generation",
        id="resume-history-deleted",
    ),
    pytest.param(
        lambda t: ["search", "--no-progress", "--resume", str(t / "nope")],
        "nope: no such directory",
        id="resume-missing-dir",
    ),
    pytest.param(
        lambda t: ["export", str(exportable_run(t))],
        "export: give -o FILE and/or --into MODEL_DIR",
        id="export-no-destination",
    ),
    pytest.param(
        lambda t: ["export", str(exportable_run(t)), "-o", str(t)],
        "is a directory; give a file name",
        id="export-output-is-dir",
    ),
    pytest.param(
        lambda t: ["export", str(exportable_run(t)), "-o", str(write(t / "file", "x") / "x.json")],
        "file' is not a directory",
        id="export-output-under-file",
    ),
    pytest.param(
        lambda t: ["export", str(exportable_run(t)), "--into", str(model_dir(t, head_dim=64, hidden_size=256))],
        "the model has 32 rotary pairs (head_dim 64), the factors are for 16",
        id="export-into-other-head-dim",
    ),
    pytest.param(
        lambda t: ["export", str(exportable_run(t)), "--into", str(model_dir(t, max_position_embeddings=128))],
        "the model's original length is 128, the factors' is 64",
        id="export-into-other-original-length",
    ),
    pytest.param(
        lambda t: ["export", str(exportable_run(t)), "--into", str(t)],
        "has no config.json",
        id="export-into-no-config",
    ),
    pytest.param(
        lambda t: ["export", str(exportable_run(t)), "--into", str(model_dir(t, [LLAMA]))],
        "config.json' holds a JSON list, not an object",
        id="export-into-config-list",
    ),
    pytest.param(
        lambda t: ["export", str(exportable_run(t, head_dim=None)), "-o", str(t / "f.json")],
        "job.json: head_dim: Field required",
        id="export-job-missing-field",
    ),
    # 5. model directories for `longrope search` (each fails before any worker starts)
    pytest.param(lambda t: model_search(t, model_dir(t)), "has no weights (*.safetensors)", id="model-no-weights"),
    pytest.param(
        lambda t: model_search(t, model_dir(t, weights="pytorch_model.bin")),
        "holds only pickle checkpoints (pytorch_model.bin)",
        id="model-pickle-only",
    ),
    pytest.param(
        lambda t: search(t, base(t, model={"device": "cuda"})),
        "device: 'cuda' was asked for but torch sees no CUDA device",
        id="model-device-cuda",
    ),
    pytest.param(
        lambda t: model_search(
            t, model_dir(t, weights="model.safetensors", num_attention_heads=3, num_key_value_heads=3, head_dim=None)
        ),
        "not a multiple of the number of attention heads",
        id="model-heads-do-not-divide-hidden",
    ),
    pytest.param(
        lambda t: model_search(t, model_dir(t, weights="model.safetensors", vocab_size=-1)),
        "negative dimension -1",
        id="model-negative-vocab-size",
    ),
    pytest.param(
        lambda t: search(t, base(t, model={"attn_implementation": "flash_attention_2"})),
        "'flash_attention_2' was asked for but flash-attn is not installed",
        id="model-flash-attention-missing",
    ),
    pytest.param(
        lambda t: model_search(t, model_dir(t, [LLAMA])),
        "config.json' holds a JSON list, not an object",
        id="model-config-json-list",
    ),
]


@pytest.mark.parametrize(("make_args", "expected"), CASES)
def test_bad_input_is_one_line_and_writes_nothing(make_args, expected, tmp_path, capsys, caplog, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative default (runs/job) would land here, and be seen
    line = cli_error_line(make_args(tmp_path), capsys, caplog, folder=tmp_path)
    assert expected in line
