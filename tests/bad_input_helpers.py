"""Building blocks of the bad-input tables (test_bad_input_cli.py, test_bad_input_cli_files.py): files written
into the test's folder and the `longrope` argv that reads them."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import yaml
from search_helpers import JOB_RECORD, known_problem_run


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


def exportable_run(t: Path, **drop_or_change) -> Path:
    """A finished run with a hand-written job.json; a keyword set to None drops that field."""
    run_dir = known_problem_run(t / "run")
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
    run_dir = known_problem_run(t / "run")
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
