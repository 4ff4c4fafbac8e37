"""What a first user sees: no line that reads like a failure when nothing failed (Ray's restart warning,
transformers' loading bars, paths cut at 80 columns when piped), a real worker error still shown, `validate`
checking the data as it checks the model (and `--offline` for a cluster's config on a laptop), and a CSV
export that loses nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import ray
import torch
import yaml
from cli_checks import longrope_block, write_factors_file
from conftest import save_tiny_llama
from search_helpers import JOB_RECORD, known_problem_run, unloadable_safetensors

from longrope.encodings import LongRope
from longrope.search.cli.main import main
from longrope.workers.models import load_model
from longrope.workers.pool import WorkerPool
from longrope.workers.reference_recipe import reference_model_dir
from longrope.workers.scorer import Scorer
from longrope.workers.scoring_worker import WindowsMissing
from longrope.workers.specs import ModelSpec, PoolSpec

pytestmark = pytest.mark.slow
LONGROPE = shutil.which("longrope", path=str(Path(sys.executable).parent))
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
RAY_RESTART_WARNING = ("core_worker.cc", "max_restarts > 0")
SMALL_SEARCH = [
    "search.generations=1",
    "search.seeds=[pi, ntk, yarn]",  # the paper's three, not the tuned grids: the counts are worked for them
    "search.population=8",
    "search.parents=4",
    "search.mutations=2",
    "search.crossovers=2",
]


def piped(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The CLI as a pipe or a CI log sees it: stdout and stderr are not terminals, and no COLUMNS tells rich
    a width."""
    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
    return subprocess.run([LONGROPE, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=600)


def long_folder(tmp_path: Path) -> Path:
    """A folder whose path is well past 80 characters, as cluster paths are."""
    return tmp_path / ("a-folder-name-long-enough-to-pass-eighty-columns-" * 2) / "runs"


def set_args(*overrides: str) -> list[str]:
    return [arg for override in overrides for arg in ("--set", override)]


# ---- 5. noise that reads like failure ----


def test_a_search_prints_no_ray_error_and_keeps_paths_whole(tmp_path):
    """Ray logged `core_worker.cc: ... has constructor arguments in the object store and max_restarts > 0`
    at error level for every worker (the windows were a constructor argument); rich cut the run directory's
    path at 80 columns when stderr was a pipe."""
    out = long_folder(tmp_path) / "demo"
    result = piped(
        "search",
        str(CONFIGS / "demo.yaml"),
        "--no-progress",
        *set_args(f"output_dir={out}", *SMALL_SEARCH),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    for marker in RAY_RESTART_WARNING:
        assert marker not in result.stderr, result.stderr
    assert any(line.endswith(f"run dir {out}") for line in result.stderr.splitlines()), result.stderr
    assert "Loading weights" not in result.stderr


def test_a_worker_that_fails_still_says_why(tmp_path):
    """Quieter output must not hide a real worker error: a model the driver's check passes (its config builds)
    but no worker can load reaches the console as one line with the worker's own exception."""
    broken = save_tiny_llama(tmp_path / "broken")
    (broken / "model.safetensors").write_bytes(unloadable_safetensors())
    config = {
        "model": {"path": str(broken), "device": "cpu"},
        "data": {"tokenizer": "bytes", "search_windows": 2},
        "target_length": 128,
        "workers": {"num_workers": 1},
        "output_dir": str(tmp_path / "run"),
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    result = piped("search", str(tmp_path / "c.yaml"), "--no-progress", *set_args(*SMALL_SEARCH), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("longrope: error:")]
    assert len(errors) == 1 and "could not load the model: SafetensorError" in errors[0], result.stderr
    for marker in RAY_RESTART_WARNING:
        assert marker not in result.stderr, result.stderr


def test_loading_a_model_draws_no_progress_bar(capfd):
    """transformers drew "Loading weights: 100%|...|" on stderr for every load (each worker, `verify`); the
    bar is off for the load and back on after it, so nothing else of transformers' output is changed."""
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled()
    load_model(reference_model_dir(), device="cpu")
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled(), "the caller's setting is restored"


def test_a_piped_export_prints_its_path_on_one_line(tmp_path):
    run = known_problem_run(tmp_path / "run")
    (run / "job.json").write_text(json.dumps(JOB_RECORD))
    out = long_folder(tmp_path) / "factors.json"
    out.parent.mkdir(parents=True)
    result = piped("export", str(run), "-o", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"export: wrote {out}" in result.stderr.splitlines(), result.stderr


ORIGINAL, TARGET, PAIRS = 64, 128, 16


def candidates(count: int) -> list[tuple[int, LongRope]]:
    return [
        (
            i,
            LongRope.from_factors(
                torch.linspace(1.0, 1.0 + 0.2 * i, PAIRS), head_dim=32, original_length=ORIGINAL, target_length=TARGET
            ),
        )
        for i in range(count)
    ]


def restarted_answer(actor, old_pid: int) -> BaseException:
    """What the actor's restarted instance answers to `ready` (asked until the kill has landed and Ray has
    brought it back: before that the old instance answers, or the call fails with the dying one)."""
    for _ in range(1000):
        try:
            info = ray.get(actor.ready.remote())
        except ray.exceptions.RayTaskError as exc:  # the call ran and raised: the new instance
            return exc.cause
        except ray.exceptions.RayActorError:  # dying or being restarted
            continue
        assert info["pid"] == old_pid, "the restarted instance answered ready(): it got windows it was not sent"
        time.sleep(0.05)
    raise AssertionError("the killed worker was not restarted")


def test_a_restarted_worker_gets_its_windows_again(local_ray, tiny_llama_dir):
    """The windows now reach a worker by a call, not as a constructor argument, so a worker Ray restarts comes
    back without them: it says so instead of scoring, and the pool sends them again and takes it back."""
    windows = np.random.default_rng(1).integers(0, 96, size=(2, TARGET + 1))
    model, rope = load_model(tiny_llama_dir, device="cpu")
    scorer = Scorer(model, torch.from_numpy(windows), rope.method.original_inv_freq(), candidates_per_forward=2)
    direct = dict(zip(range(6), scorer.score([m for _, m in candidates(6)]), strict=True))
    spec = ModelSpec(model_dir=str(tiny_llama_dir), device="cpu", candidates_per_forward=2, tokens_per_forward=TARGET)
    pool = WorkerPool(spec, windows, PoolSpec(num_workers=1, num_cpus_per_worker=0.5, batch_size=1))
    try:
        (before,) = pool.worker_info()
        ray.kill(pool.workers[0].actor, no_restart=False)
        assert isinstance(restarted_answer(pool.workers[0].actor, before["pid"]), WindowsMissing)
        results = dict(pool.imap(candidates(6)))
        assert sorted(results) == list(range(6))
        for key, score in results.items():
            assert score.nll == pytest.approx(direct[key].nll, rel=1e-6)
        (after,) = pool.worker_info()
        assert after["pid"] != before["pid"] and pool.workers[0].usable
    finally:
        pool.shutdown()


# ---- 6. validate: data checked as the model is; --offline ----

HEAVY = ("torch", "ray", "transformers")
PROBE = """
import json, sys
from longrope.search.cli.main import main
code = main(json.loads(sys.argv[1]))
print(json.dumps({"code": code, "loaded": [m for m in HEAVY if m in sys.modules]}))
""".replace("HEAVY", repr(HEAVY))


def factors_file(path: Path, long_factor: list[float]) -> Path:
    block = longrope_block(long_factor, original=8192, factor=8.0, attention_factor=1.2)
    return write_factors_file(path, block, max_position_embeddings=65536)


def test_validate_offline_needs_neither_the_model_nor_the_data_nor_torch(tmp_path):
    """A cluster's config on a laptop: model and data paths that do not exist here are skipped (and listed as
    skipped), a factors file that is here is still read, and neither torch nor Ray is imported."""
    seed = factors_file(tmp_path / "seed.json", [1.0] * 32 + [2.0] * 32)
    argv = [
        "validate",
        str(CONFIGS / "llama3-8b-64k.yaml"),
        "--offline",
        "--json",
        *set_args("data.search_source=/cluster/pg19/validation", f"search.seed_files=[{seed}, /cluster/runs/r1]"),
    ]
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    *document, last = out.stdout.strip().splitlines()
    assert json.loads(last) == {"code": 0, "loaded": []}, out.stderr
    checks = {(c["what"], str(c["value"])): c["result"] for c in json.loads("\n".join(document))["checks"]}
    assert checks[("model.path", "/models/Meta-Llama-3-8B")] == "skipped"
    assert checks[("data.search_source", "/cluster/pg19/validation")] == "skipped"
    assert checks[("search.seed_files", str(seed))] == "ok"
    assert checks[("search.seed_files", "/cluster/runs/r1")] == "skipped"
    assert checks[("config", "None")] == checks[("lengths", "65536")] == "ok"
    assert "not checked: model.path" in out.stderr


def test_validate_lists_what_it_checked(tmp_path, capsys):
    source = tmp_path / "docs.jsonl"
    # the demo's 24 test windows of 1025 tokens (the reference model reads bytes): 24 documents of about 1300
    source.write_text("".join(json.dumps({"text": f"document {i:02d} " * 100}) + "\n" for i in range(24)))
    assert main(["validate", str(CONFIGS / "demo.yaml"), "--json", "--set", f"data.test_source={source}"]) == 0
    document = json.loads(capsys.readouterr().out)
    checks = {c["what"]: c for c in document["checks"]}
    assert {"config", "model.path", "lengths", "search.seeds", "data.search_source", "data.test_source"} <= set(checks)
    assert all(c["result"] == "ok" for c in checks.values())
    assert checks["data.test_source"]["value"] == str(source) and "24 documents" in checks["data.test_source"]["detail"]
    assert document["original_length"] == 128 and document["config"]["data"]["test_source"] == str(source)


# ---- 8. CSV export keeps everything ----


def test_csv_export_keeps_the_release_format_and_writes_the_rest_beside_it(tmp_path, capsys):
    """The CSV stays the LongRoPE release's file (long factors, one per line, read by np.loadtxt); the block's
    attention factor, mscales and provenance, which it cannot hold, are in `f.csv.json`, equal to the JSON
    export."""
    run = known_problem_run(tmp_path / "run")
    (run / "job.json").write_text(json.dumps(JOB_RECORD))
    assert main(["export", str(run), "-o", str(tmp_path / "f.json")]) == 0
    assert main(["export", str(run), "-o", str(tmp_path / "f.csv"), "--format", "csv"]) == 0
    exported = json.loads((tmp_path / "f.json").read_text())
    long_factor = exported["rope_parameters"]["long_factor"]
    lines = (tmp_path / "f.csv").read_text().splitlines()
    assert [float(line) for line in lines] == long_factor
    assert np.loadtxt(tmp_path / "f.csv", delimiter=",").tolist() == long_factor
    sidecar = json.loads((tmp_path / "f.csv.json").read_text())
    assert sidecar == exported
    assert {"attention_factor", "short_mscale", "long_mscale"} <= set(sidecar["rope_parameters"])
    assert f"export: wrote {tmp_path / 'f.csv.json'}" in capsys.readouterr().err
