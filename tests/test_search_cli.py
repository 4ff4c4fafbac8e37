"""Bad input to the search service: one line on stderr naming the field and value, non-zero exit, nothing
written or overwritten. Run through the installed `longrope` script, as a user runs it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cli_checks import snapshot
from search_helpers import JOB_RECORD, known_problem_run

from longrope.search.optimizers.factory import load_job_config

pytestmark = pytest.mark.slow
LONGROPE = shutil.which("longrope", path=str(Path(sys.executable).parent))
CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([LONGROPE, *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def write(path: Path, data) -> Path:
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def seed_file(path: Path, factors: list[float]) -> Path:
    block = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "long_factor": factors,
        "short_factor": [1.0] * 16,
        "original_max_position_embeddings": 128,
        "factor": 8.0,
        "attention_factor": 1.1,
    }
    path.write_text(
        json.dumps(
            {
                "rope_parameters": block,
                "max_position_embeddings": 1024,
                "provenance": {"created_by": "test", "method": "x", "method_rope_parameters": {}},
            }
        )
    )
    return path


def base(tmp_path: Path, **fields) -> dict:
    return {"target_length": 1024, "output_dir": str(tmp_path / "out"), **fields}


CASES = {
    "unknown field": (
        lambda t: ["validate", str(write(t / "c.yaml", base(t, serach={"seed": 1})))],
        "serach: unknown field",
    ),
    "target <= original": (
        lambda t: ["validate", str(write(t / "c.yaml", base(t, target_length=100)))],
        "target_length: must be greater than original_length (128), got 100",
    ),
    "parents > population": (
        lambda t: ["search", str(write(t / "c.yaml", base(t, search={"parents": 99})))],
        "search.parents: must be <= population (64), got 99",
    ),
    "negative windows": (
        lambda t: ["validate", str(write(t / "c.yaml", base(t, data={"search_windows": -3})))],
        "data.search_windows = -3",
    ),
    "non-finite value": (
        lambda t: ["validate", str(write(t / "c.yaml", base(t)).with_name("c.yaml")), "--set", "search.grid_step=.nan"],
        "search.grid_step = nan: must be a finite",
    ),
    "missing config file": (lambda t: ["validate", str(t / "nope.yaml")], "nope.yaml: no such config file"),
    "invalid YAML": (lambda t: ["validate", str(write(t / "c.yaml", "target_length: [1,\n"))], "not valid YAML"),
    "bad --set": (
        lambda t: ["validate", str(write(t / "c.yaml", base(t))), "--set", "generations"],
        "--set 'generations': expected FIELD=VALUE",
    ),
    "missing model directory": (
        lambda t: ["search", str(write(t / "c.yaml", base(t, model={"path": str(t / "m")})))],
        "model.path: model directory",
    ),
    "seed factors of the wrong length": (
        lambda t: [
            "search",
            str(
                write(t / "c.yaml", base(t, search={"seed_files": [str(seed_file(t / "s.json", [1.0] * 14 + [2.0]))]}))
            ),
        ],
        "long_factor: expected 16 factors",
    ),
    "non-monotone seed factors": (
        lambda t: [
            "search",
            str(
                write(
                    t / "c.yaml",
                    base(t, search={"seed_files": [str(seed_file(t / "s.json", [1.0] * 8 + [3.0, 2.0] + [3.0] * 6))]}),
                )
            ),
        ],
        "factors must be non-decreasing, got 3.0 then 2.0 at pair 9",
    ),
    "seed factors below one": (
        lambda t: [
            "search",
            str(
                write(t / "c.yaml", base(t, search={"seed_files": [str(seed_file(t / "s.json", [0.5] + [1.0] * 15))]}))
            ),
        ],
        "factors must be >= 1, got 0.5 at pair 0",
    ),
    "seed file not JSON": (
        lambda t: [
            "search",
            str(write(t / "c.yaml", base(t, search={"seed_files": [str(write(t / "s.json", "{oops"))]}))),
        ],
        "not valid JSON",
    ),
    "corpus too short": (
        lambda t: ["search", str(write(t / "c.yaml", base(t, data={"search_windows": 5000})))],
        "data.search_source = 'corpus:search': 5000 windows of 1025 tokens need 5000 documents at least that long",
    ),
    "search with neither config nor resume": (lambda t: ["search"], "give a CONFIG, or --resume RUN_DIR"),
    "unreachable cluster address": (
        lambda t: ["search", str(write(t / "c.yaml", base(t, workers={"address": "127.0.0.1:1"})))],
        "workers.address = '127.0.0.1:1': nothing answers there within 10 s",
    ),
    "export of a folder that is no run": (
        lambda t: ["export", str(t), "-o", str(t / "f.json")],
        "config.json: missing (is",
    ),
    "compare with a missing factors file": (
        lambda t: ["compare", str(write(t / "c.yaml", base(t))), "--factors", str(t / "none.json")],
        "none.json': no such file",
    ),
    "compare with a missing test source": (
        lambda t: ["compare", str(write(t / "c.yaml", base(t))), "--set", f"data.test_source={t / 'none.jsonl'}"],
        "none.jsonl' does not exist",
    ),
    "compare with bad lengths": (
        lambda t: ["compare", str(write(t / "c.yaml", base(t))), "--lengths", "1k,2k"],
        "--lengths: expected comma-separated integers",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_and_writes_nothing(case, tmp_path):
    make_args, message = CASES[case]
    args = make_args(tmp_path)
    before = snapshot(tmp_path)
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("longrope: error:"), result.stderr
    assert message in lines[0]
    assert snapshot(tmp_path) == before, "bad input must not write or overwrite anything"


def test_resume_with_corrupted_state_or_another_config(finished_known_problem_run, tmp_path):
    before = snapshot(finished_known_problem_run)
    other = write(tmp_path / "other.yaml", {"target_length": 512, "output_dir": str(finished_known_problem_run)})
    result = run_cli("search", str(other), cwd=tmp_path)
    assert result.returncode == 2 and "holds a run of another config" in result.stderr
    state = finished_known_problem_run / "state.json"
    state.write_text(state.read_text()[:40])
    before = snapshot(finished_known_problem_run)
    result = run_cli("search", "--resume", str(finished_known_problem_run), cwd=tmp_path)
    assert result.returncode == 2 and "state.json: corrupted" in result.stderr
    assert snapshot(finished_known_problem_run) == before


def test_status_and_export_of_a_finished_run(finished_known_problem_run, tmp_path):
    status = run_cli("status", str(finished_known_problem_run), "--json", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    summary = json.loads(status.stdout)
    assert summary["finished"] and summary["generation"] == summary["generations"] == 1, "a 1-generation run"
    assert set(summary["seed_perplexities"]) == {"pi", "ntk", "yarn"}
    result = run_cli("export", str(finished_known_problem_run), "-o", str(tmp_path / "f.json"), cwd=tmp_path)
    assert result.returncode == 0 and "warning" not in result.stderr, result.stderr
    provenance = json.loads((tmp_path / "f.json").read_text())["provenance"]
    assert (provenance["finished"], provenance["generation"], provenance["generations"]) == (True, 1, 1)
    # without job.json (the model's shape) export says so in one line
    (finished_known_problem_run / "job.json").unlink()
    result = run_cli("export", str(finished_known_problem_run), "-o", str(tmp_path / "g.json"), cwd=tmp_path)
    assert result.returncode == 2 and "job.json: missing" in result.stderr


def test_status_reads_the_run_record(finished_known_problem_run, tmp_path):
    """With job.json, status names the model and lengths, and the best candidate's attention factor as the
    encoding it was scored with (the one in its history record)."""
    (finished_known_problem_run / "job.json").write_text(json.dumps(JOB_RECORD))
    summary = json.loads(run_cli("status", str(finished_known_problem_run), "--json", cwd=tmp_path).stdout)
    history = [json.loads(line) for line in (finished_known_problem_run / "history.jsonl").read_text().splitlines()]
    best = min((r for r in history if r.get("status", "scored") == "scored"), key=lambda r: r["perplexity"])
    assert (summary["model"], summary["original_length"], summary["target_length"]) == ("m", 64, 256)
    assert summary["best_attention_factor"] == pytest.approx(best["attention_factor"])
    short = known_problem_run(
        tmp_path / "short",
        "search.factor=short",
        "search.long_factors=f.json",
        factor="short",
        long_factor=[2.0] * 16,
        attention_factor=1.25,
        search_windows={"count": 1, "tokens": 65},  # a short-factor search reads windows of original_length
    )
    summary = json.loads(run_cli("status", str(short), "--json", cwd=tmp_path).stdout)
    history = [json.loads(line) for line in (short / "history.jsonl").read_text().splitlines()]
    best = min((r for r in history if r.get("status", "scored") == "scored"), key=lambda r: r["perplexity"])
    assert summary["factor"] == "short" and summary["best_attention_factor"] == pytest.approx(best["attention_factor"])
    assert "64 -> 256 tokens (short factors), model m" in run_cli("status", str(short), cwd=tmp_path).stdout


# each shipped config: the target length its name promises, and the length its model was pre-trained at (the
# model cards: Llama 2 4k, Llama 3 8k, Mistral 7B v0.1 8k, Phi-3-mini-4k 4k, SmolLM2 8k; the demo's is read from the
# model)
SHIPPED = {
    "demo": (1024, None),
    "gemma3-270m-64k-cpu": (64 * 1024, None),
    "llama2-7b-32k": (32 * 1024, 4096),
    "llama3-8b-64k": (64 * 1024, 8192),
    "mistral-7b-32k": (32 * 1024, 8192),
    "phi3-mini-128k": (128 * 1024, 4096),
    "smollm2-135m-16k": (16 * 1024, 8192),
    "smollm2-135m-16k-ga": (16 * 1024, 8192),
    "smollm2-135m-16k-hybrid": (16 * 1024, 8192),
    "smollm2-135m-32k": (32 * 1024, 8192),
    "smollm2-135m-32k-cpu": (32 * 1024, 8192),
}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_configs_validate(name):
    config = load_job_config(CONFIGS / f"{name}.yaml", ["model.path=reference"] if name != "demo" else [])
    assert (config.target_length, config.original_length) == SHIPPED[name]
    assert config.name == name and config.output_dir == f"runs/{name}"
    assert sorted(path.stem for path in CONFIGS.glob("*.yaml")) == sorted(SHIPPED), "a new config needs its row"
