"""The light commands import neither torch nor Ray: `longrope --help`, `status` (`--plot` too), `export` and
`estimate` answer at once, and `validate` checks a model on the meta device (torch) without starting Ray; `status`
without --plot imports neither matplotlib nor tensorboard either."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from search_helpers import JOB_RECORD, known_problem_run

HEAVY = ("torch", "ray", "transformers")
CONFIGS = Path(__file__).resolve().parents[1] / "configs"

# main(argv) in a fresh interpreter, then which of the modules named it loaded (SystemExit from --help included)
PROBE = """
import json, sys
from longrope.search.cli.main import main
try:
    code = main(json.loads(sys.argv[1]))
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "loaded": [m for m in json.loads(sys.argv[2]) if m in sys.modules]}))
"""


def loaded_by(argv: list[str], cwd, modules: tuple[str, ...] = HEAVY) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv), json.dumps(modules)],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = known_problem_run(tmp_path_factory.mktemp("startup") / "run")
    (path / "job.json").write_text(json.dumps(JOB_RECORD))
    return path


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(lambda run, tmp: ["--help"], id="help"),
        pytest.param(lambda run, tmp: ["search", "--help"], id="search-help"),
        pytest.param(lambda run, tmp: ["status", str(run)], id="status"),
        pytest.param(lambda run, tmp: ["status", str(run), "--json"], id="status-json"),
        pytest.param(lambda run, tmp: ["status", str(run), "--plot", str(tmp / "p.png")], id="status-plot"),
        pytest.param(lambda run, tmp: ["export", str(run), "-o", str(tmp / "f.json")], id="export"),
        pytest.param(lambda run, tmp: ["export", str(run), "-o", str(tmp / "f.csv"), "--format", "csv"], id="csv"),
        pytest.param(lambda run, tmp: ["estimate", str(CONFIGS / "llama3-8b-64k.yaml")], id="estimate"),
    ],
)
def test_light_commands_import_neither_torch_nor_ray(argv, run_dir, tmp_path):
    result = loaded_by(argv(run_dir, tmp_path), tmp_path)
    assert result["code"] == 0 and result["loaded"] == []


def test_status_without_plot_imports_neither_matplotlib_nor_tensorboard(run_dir, tmp_path):
    result = loaded_by(["status", str(run_dir)], tmp_path, ("matplotlib", "tensorboard", "torch", "ray"))
    assert result == {"code": 0, "loaded": []}
    assert loaded_by(["status", str(run_dir), "--plot", str(tmp_path / "p.png")], tmp_path, ("matplotlib",)) == {
        "code": 0,
        "loaded": ["matplotlib"],
    }, "the probe sees matplotlib when it is there"


def test_export_without_torch_writes_the_same_block_as_with_it(run_dir, tmp_path):
    """The torch-free path computes the block (attention factor, mscales) exactly as the encodings do."""
    from longrope.search.export.factors_export import factors_file_of_run
    from longrope.search.run.run_store import RunDir

    assert loaded_by(["export", str(run_dir), "-o", str(tmp_path / "f.json")], tmp_path)["loaded"] == []
    written = json.loads((tmp_path / "f.json").read_text())["rope_parameters"]
    assert written == factors_file_of_run(RunDir(run_dir)).rope_parameters.model_dump(mode="json", exclude_none=True)


def test_validate_checks_the_model_without_starting_ray(tmp_path):
    result = loaded_by(["validate", "configs/demo.yaml"], cwd=None)
    assert result["code"] == 0
    assert "ray" not in result["loaded"]
    assert "torch" in result["loaded"], "validate builds the model on the meta device to check its shape"
