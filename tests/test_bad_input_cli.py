"""Bad input to the `longrope` CLI, run in-process through `main(argv)`: exit code 2, exactly one line on stderr
("longrope: error: ..." naming the field or value), nothing on stdout, and nothing written under the test's
folder. Complements the subprocess cases in test_search_cli.py (none of those is repeated here).

The reference model (`model.path: reference`) has original length 128 and 16 rotary pairs; the cheap run
directory (longrope.search.run.known_problem) has head_dim 32, original length 64 and target length 256.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from cli_checks import cli_error_line
from search_helpers import JOB_RECORD
from search_helpers import finished_run as make_finished_run

# ---- helpers ----


def write(path: Path, data) -> Path:
    """Write bytes, text, or anything else as YAML."""
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def base(t: Path, **fields) -> dict:
    return {"target_length": 1024, "output_dir": str(t / "out"), **fields}


def validate(t: Path, data, *overrides: str) -> list[str]:
    """`longrope validate t/c.yaml [--set ...]`; `data` is YAML text, bytes, or a dict dumped as YAML."""
    args = ["validate", str(write(t / "c.yaml", data))]
    for override in overrides:
        args += ["--set", override]
    return args


def search(t: Path, data) -> list[str]:
    return ["search", "--no-progress", str(write(t / "c.yaml", data))]


def factors(*args: str) -> list[str]:
    return ["encodings", "factors", *args]


def finished_run(t: Path) -> Path:
    return make_finished_run(t / "run")


def exportable_run(t: Path, **drop_or_change) -> Path:
    """A finished run with a hand-written job.json; a keyword set to None drops that field."""
    run_dir = finished_run(t)
    job = {**JOB_RECORD, **drop_or_change}
    job = {k: v for k, v in job.items() if v is not None}
    (run_dir / "job.json").write_text(json.dumps(job))
    return run_dir


# a small Llama config (16 rotary pairs, original length 64), as a user's model directory would hold it
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 96,
    "num_hidden_layers": 1,
    "vocab_size": 96,
    "max_position_embeddings": 64,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def model_dir(t: Path, config=None, *, weights: str | None = None, name: str = "m", **changes) -> Path:
    """t/name with config.json (LLAMA with `changes`; a key set to None is dropped; `config` replaces it whole)
    and, if given, a weights file of that name (any bytes: nothing reads them before the checks under test)."""
    path = t / name
    path.mkdir()
    if config is None:
        config = {k: v for k, v in {**LLAMA, **changes}.items() if v is not None}
    (path / "config.json").write_text(json.dumps(config))
    if weights:
        (path / weights).write_bytes(b"not really weights")
    return path


def model_search(t: Path, model: Path, **model_fields) -> list[str]:
    """`longrope search` of a model directory (byte tokenizer, so the tokenizer is not what fails)."""
    return search(t, base(t, model={"path": str(model), **model_fields}, data={"tokenizer": "bytes"}))


def edit_run(t: Path, name: str, edit: Callable[[str], str]) -> Path:
    run_dir = finished_run(t)
    path = run_dir / name
    path.write_text(edit(path.read_text()))
    return run_dir


def replace_line(text: str, number: int, line: str) -> str:
    lines = text.splitlines(keepends=True)
    assert len(lines) > number + 1, "the run's history must have lines after the one replaced"
    lines[number] = line + "\n"
    return "".join(lines)


def drop_key_of_line(text: str, number: int) -> str:
    record = json.loads(text.splitlines()[number])
    del record["key"]
    return replace_line(text, number, json.dumps(record))


def edited_hash(text: str) -> str:
    data = json.loads(text)
    data["config_hash"] = "0" * 16
    return json.dumps(data)


def deleted(path: Path) -> Path:
    path.unlink()
    return path


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    lines = ["target_length: 1024", 'l0: &l0 ["lol"' + ', "lol"' * (width - 1) + "]"]
    for level in range(1, levels):
        lines.append(f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def random_bytes() -> bytes:
    data = bytearray(random.Random(0).randbytes(4096))
    data[100] = 0  # a NUL for certain
    return bytes(data)


# ---- the table: id -> (argv builder, a substring of the one error line) ----

CASES = [
    # 1. YAML config files
    pytest.param(lambda t: validate(t, random_bytes()), "c.yaml: not UTF-8 text (byte", id="yaml-binary-random"),
    pytest.param(
        lambda t: validate(t, "target_length: 1024\nname: a\x00b\n"),
        "c.yaml: holds a NUL character at offset 27",
        id="yaml-nul-in-utf8-text",
    ),
    pytest.param(
        lambda t: validate(t, b"target_length: 1024\nname: caf\xe9\n"),
        "c.yaml: not UTF-8 text (byte 29)",
        id="yaml-non-utf8",
    ),
    pytest.param(
        lambda t: validate(t, "target_length: 1024\na: &x [*x]\n"),
        "line 2: an alias refers to a node that contains it",
        id="yaml-recursive-alias",
    ),
    pytest.param(
        lambda t: validate(t, alias_bomb()),
        "holds more than 100000 values once aliases are expanded",
        id="yaml-billion-laughs",
    ),
    pytest.param(
        lambda t: validate(t, "target_length: 1024\nname: x\ntarget_length: 2048\n"),
        "key 'target_length' given twice (lines 1 and 3)",
        id="yaml-duplicate-key",
    ),
    pytest.param(
        lambda t: validate(t, "- target_length: 1024\n"),
        "expected a mapping of fields at the top level, got list",
        id="yaml-top-level-list",
    ),
    pytest.param(
        lambda t: validate(t, "1024\n"),
        "expected a mapping of fields at the top level, got int",
        id="yaml-top-level-scalar",
    ),
    pytest.param(
        lambda t: validate(t, "target_length: 1024\n# " + "x" * (1 << 20) + "\n"),
        "bytes; a config is at most 1048576 bytes",
        id="yaml-over-1mib",
    ),
    pytest.param(
        lambda t: validate(t, "target_length: " + "[" * 5000 + "]" * 5000 + "\n"),
        "c.yaml: nested too deeply",
        id="yaml-deeply-nested",
    ),
    pytest.param(lambda t: ["validate", str(t)], "is a directory, not a config file", id="yaml-path-is-a-directory"),
    pytest.param(lambda t: validate(t, base(t), "=3"), "--set '=3': expected FIELD=VALUE", id="set-empty-key"),
    pytest.param(
        lambda t: validate(t, base(t), "target_length.x=1"),
        "--set target_length.x: target_length is not a section",
        id="set-into-non-section",
    ),
    # 2. values `validate` refuses
    pytest.param(
        lambda t: validate(t, base(t, search={"seed": -1})),
        "search.seed = -1: Input should be greater than or equal to 0",
        id="search-seed-negative",
    ),
    pytest.param(
        lambda t: validate(t, base(t, data={"seed": -1})),
        "data.seed = -1: Input should be greater than or equal to 0",
        id="data-seed-negative",
    ),
    pytest.param(
        lambda t: validate(t, base(t, search={"grid_step": 1e-30})),
        "search.grid_step = 1e-30: Input should be greater than or equal to 0.0001",
        id="grid-step-tiny",
    ),
    pytest.param(
        lambda t: validate(t, base(t, search={"max_factor": 1e300})),
        "search.max_factor = 1e+300: Input should be less than or equal to 10000",
        id="max-factor-huge",
    ),
    pytest.param(
        lambda t: validate(t, f"target_length: {10**30}\noutput_dir: {t / 'out'}\n"),
        f"target_length = {10**30}: Input should be less than or equal to 67108864",
        id="target-length-1e30",
    ),
    pytest.param(
        lambda t: validate(t, f"target_length: 1024\noriginal_length: {10**30}\noutput_dir: {t / 'out'}\n"),
        f"original_length = {10**30}: Input should be less than or equal to 67108864",
        id="original-length-1e30",
    ),
    pytest.param(
        lambda t: validate(t, base(t, output_dir="")),
        "output_dir = '': String should have at least 1 character",
        id="output-dir-empty",
    ),
    pytest.param(
        lambda t: validate(t, base(t, output_dir="   ")),
        "output_dir = '   ': must name a directory",
        id="output-dir-blank",
    ),
    pytest.param(
        lambda t: validate(t, base(t, search={"attention_factor": {"step": 1e-30}})),
        "search.attention_factor.step = 1e-30: Input should be greater than or equal to 0.0001",
        id="attention-factor-step-tiny",
    ),
    pytest.param(
        lambda t: validate(t, base(t, search={"population": 10**12})),
        "search.population = 1000000000000: Input should be less than or equal to 1000000",
        id="population-huge",
    ),
    pytest.param(
        lambda t: validate(t, base(t, search={"n_hat": {"enabled": True, "choices": [0, 4, 1024]}})),
        "search.n_hat.choices: every choice must be < target_length (1024), got 1024",
        id="n-hat-choice-at-target",
    ),
    pytest.param(
        lambda t: validate(t, base(t, workers={"num_workers": 0})),
        "workers.num_workers = 0: Input should be greater than or equal to 1",
        id="num-workers-zero",
    ),
    pytest.param(
        lambda t: validate(t, base(t, search={"generations": "ten"})),
        "search.generations = 'ten': Input should be a valid integer",
        id="string-for-int",
    ),
    pytest.param(
        lambda t: validate(t, base(t, model={"trust_remote_code": "perhaps"})),
        "model.trust_remote_code = 'perhaps': Input should be a valid boolean",
        id="boolean-ish-string",
    ),
    pytest.param(
        lambda t: validate(t, base(t, target_length=None)),
        "target_length = None: Input should be a valid integer",
        id="target-length-null",
    ),
    pytest.param(
        lambda t: validate(t, base(t), "search.max_factor=.inf"),
        "search.max_factor = inf: must be a finite number",
        id="set-inf",
    ),
    pytest.param(
        lambda t: validate(t, base(t, search={"change_probability": -0.1})),
        "search.change_probability = -0.1: Input should be greater than 0",
        id="change-probability-negative",
    ),
    # data sources: checked by `validate` as the model is, one line naming the field and the value
    pytest.param(
        lambda t: validate(t, base(t, data={"search_source": "none.jsonl"})),
        "data.search_source: 'none.jsonl' does not exist",
        id="validate-missing-search-source",
    ),
    pytest.param(
        lambda t: (t / "empty").mkdir() or validate(t, base(t, data={"test_source": "empty"})),
        "data.test_source: 'empty' holds no .txt/.md/.jsonl/.parquet documents",
        id="validate-data-folder-without-documents",
    ),
    pytest.param(
        lambda t: (
            write(t / "d.jsonl", '{"text": "a"}\n{oops\n') and validate(t, base(t, data={"search_source": "d.jsonl"}))
        ),
        "data.search_source: data file: d.jsonl:2 is not valid JSON",
        id="validate-data-file-not-jsonl",
    ),
    pytest.param(
        lambda t: validate(t, base(t), "data.test_source=corpus:nope"),
        "data.test_source: unknown corpus split 'nope'",
        id="validate-unknown-corpus-split",
    ),
    pytest.param(
        lambda t: (
            write(
                t / "s.json",
                json.dumps(
                    {
                        "rope_parameters": {
                            "rope_type": "longrope",
                            "rope_theta": 10000.0,
                            "long_factor": [1.0, 3.0, 2.0],
                            "short_factor": [1.0] * 3,
                            "original_max_position_embeddings": 128,
                            "factor": 8.0,
                            "attention_factor": 1.1,
                        },
                        "max_position_embeddings": 1024,
                        "provenance": {"created_by": "test", "method": "x", "method_rope_parameters": {}},
                    }
                ),
            )
            and [
                *validate(t, base(t, model={"path": "/cluster/model"}, search={"seed_files": ["s.json"]})),
                "--offline",
            ]
        ),
        "search.seed_files: s.json: rope_parameters.long_factor: factors must be non-decreasing, got 3.0 then 2.0",
        id="validate-offline-still-reads-a-local-seed-file",
    ),
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
        "--beta-fast: must be greater than --beta-slow (32.0), got 1.0",
        id="factors-beta-fast-below-slow",
    ),
    pytest.param(
        lambda t: factors("pi", "--factor", "4", "--original-length", "0", "--head-dim", "32"),
        "--original-length: must be a positive integer, got 0",
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
        lambda t: ["search", "--no-progress", "--resume", str(deleted(finished_run(t) / "history.jsonl").parent)],
        "history.jsonl: lacks",
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
    # 6. found on review: --set goes through the same YAML guards; values Ray or JSON cannot take
    pytest.param(
        lambda t: validate(t, base(t), "model.config_overrides=&a {x: *a}"),
        "--set model.config_overrides: cannot read value '&a {x: *a}' (line 1: an alias refers to a node",
        id="set-recursive-alias",
    ),
    pytest.param(
        lambda t: validate(t, base(t), "search={seed: 1, seed: 2}"),
        "key 'seed' given twice",
        id="set-duplicate-key",
    ),
    pytest.param(
        lambda t: validate(t, base(t), "model.config_overrides={x: !!binary /w==}"),
        "x: a bytes value is not allowed (JSON values only)",
        id="set-binary-value",
    ),
    pytest.param(
        lambda t: validate(t, base(t), "model.config_overrides={x: " + alias_bomb(5, 9).replace("\n", " ") + "}"),
        "--set model.config_overrides: cannot read value",
        id="set-alias-bomb",
    ),
    pytest.param(
        lambda t: validate(t, "target_length: " + "9" * 5000 + "\n"),
        "c.yaml: unreadable value (Exceeds the limit (4300 digits)",
        id="yaml-integer-past-digit-limit",
    ),
    pytest.param(
        lambda t: validate(t, base(t), "model.config_overrides.d=2024-01-01"),
        "cannot read value '2024-01-01' (value: a date value is not allowed (JSON values only))",
        id="set-date-value",
    ),
    pytest.param(
        lambda t: validate(t, base(t), "model.config_overrides={x: [1.0, .nan]}"),
        "model.config_overrides.x[1] = nan: must be a finite number",
        id="set-non-finite-in-a-list",
    ),
    pytest.param(
        lambda t: validate(t, base(t, workers={"num_cpus_per_worker": 0.00001})),
        "workers.num_cpus_per_worker = 1e-05: must be 0 or at least 0.0001",
        id="ray-resource-precision",
    ),
    pytest.param(
        lambda t: search(t, base(t, output_dir=str(write(t / "plain-file", "x") / "run"))),
        "plain-file' exists and is not a directory",
        id="output-dir-under-a-file",
    ),
    # search cost settings: racing, schedule, optimizer
    pytest.param(
        lambda t: search(t, base(t, search={"schedule": "fast"})),
        "search.schedule = 'fast': Input should be 'generational' or 'steady'",
        id="schedule-unknown",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"optimizer": "pso"})),
        "search.optimizer = 'pso': Input should be 'dim_mono', 'cmaes', 'gradient' or 'hybrid'",
        id="optimizer-unknown",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"racing": {"enabled": True, "z": -1}})),
        "search.racing.z = -1: Input should be greater than or equal to 0",
        id="racing-negative-z",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"racing": {"enabled": True, "min_windows": 1}})),
        "search.racing.min_windows = 1: Input should be greater than or equal to 2",
        id="racing-min-windows-one",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"racing": {"enabled": True, "min_windows": 8}})),
        "search.racing.min_windows: must be < data.search_windows (8) for racing to stop anything, got 8",
        id="racing-min-windows-all",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"racing": {"enabled": "sometimes"}})),
        "search.racing.enabled = 'sometimes': Input should be a valid boolean",
        id="racing-enabled-not-bool",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"racing": {"group_windows": 0}})),
        "search.racing.group_windows = 0: Input should be greater than or equal to 1",
        id="racing-group-zero",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"optimizer": "cmaes", "schedule": "steady"})),
        "search.schedule: 'steady' needs optimizer 'dim_mono'",
        id="cmaes-steady",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"optimizer": "cmaes", "racing": {"enabled": True}})),
        "search.racing.enabled: racing needs optimizer 'dim_mono'",
        id="cmaes-racing",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"optimizer": "cmaes", "cmaes": {"sigma": 0}})),
        "search.cmaes.sigma = 0: Input should be greater than 0",
        id="cmaes-sigma-zero",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"cmaes": {"population": 1}})),
        "search.cmaes.population = 1: Input should be greater than or equal to 2",
        id="cmaes-population-one",
    ),
    pytest.param(
        lambda t: validate(t, base(t), "search.racing.z=.nan"),
        "search.racing.z = nan: must be a finite number",
        id="racing-z-nan-override",
    ),
    # better factors: objectives, stages, short factors (issue 9)
    pytest.param(
        lambda t: search(t, base(t, data={"objective": {"perplexity": 0, "needle": 0}})),
        "data.objective: weights must sum to more than 0, got {",
        id="objective-weights-zero",
    ),
    pytest.param(
        lambda t: search(t, base(t, data={"objective": "needles"})),
        "data.objective: unknown objective 'needles' (expected one of perplexity, tail, needle)",
        id="objective-unknown",
    ),
    pytest.param(
        lambda t: search(t, {**base(t, data={"objective": "needle"}), "original_length": 16, "target_length": 64}),
        "data.objective: a needle needs 99 tokens for its preamble, key sentence, question and answer; windows of 65",
        id="needle-cannot-fit",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"space": "longrope2", "critical_dim": 16})),
        "search.critical_dim: must be < 16 pairs, got 16",
        id="critical-dim-out-of-range",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"space": "longrope2", "length_scale": 4})),
        "search.length_scale: must be >= target/original (8), got 4",
        id="length-scale-below-scale",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"space": "longrope2", "length_scale": 8.05})),
        "search.length_scale: must be >= 8.1 for the 11 searched pairs",
        id="length-scale-empty-space",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"stages": [512, 256]})),
        "search.stages = [512, 256]: stage lengths must increase, got 512 then 256",
        id="stages-not-increasing",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"stages": [256, 1024]})),
        "search.stages: each stage length must lie between original_length",
        id="stage-at-target",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"space": "longrope2", "length_scale": 6, "stages": [512]})),
        "search.stages: stage 2 at 1024 tokens: search.length_scale: must be >= target/original (8), got 6",
        id="stage-space-fails-only-at-the-last-stage",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"stages": [100]})),
        "search.stages: stage 1 at 100 tokens: target_length: must be greater than original_length (128), got 100",
        id="stage-below-original-length",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"stages": [256], "n_hat": {"enabled": True, "choices": [0, 512]}})),
        "search.stages: stage 1 at 256 tokens: search.n_hat.choices: every choice must be < target_length (256)",
        id="stage-shorter-than-n-hat",
    ),
    pytest.param(
        lambda t: search(
            t, base(t, data={"objective": "tail"}, search={"factor": "short", "long_factors": str(t / "f.json")})
        ),
        "data.objective: 'tail' counts positions past original_length",
        id="short-factor-with-tail",
    ),
    pytest.param(
        lambda t: search(
            t,
            base(
                t,
                search={"factor": "short", "long_factors": "f.json", "attention_factor": {"mode": "searched"}},
            ),
        ),
        "search.attention_factor.mode: a short-factor search keeps the long factors' attention factor",
        id="short-factor-with-searched-attention",
    ),
    pytest.param(
        lambda t: search(t, base(t, search={"factor": "short"})),
        "search.long_factors: factor 'short' needs the long factors it keeps",
        id="short-without-long-factors",
    ),
    pytest.param(
        lambda t: ["search", "--no-progress", "--resume", str(finished_run(t)), "--set", "search.seed=5"],
        "--set 'search.seed=5': a resumed run can change only workers.*",
        id="resume-set-outside-workers",
    ),
]


@pytest.mark.parametrize(("make_args", "expected"), CASES)
def test_bad_input_is_one_line_and_writes_nothing(make_args, expected, tmp_path, capsys, caplog, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative default (runs/job) would land here, and be seen
    line = cli_error_line(make_args(tmp_path), capsys, caplog, folder=tmp_path)
    assert expected in line
