"""The package installs as `longrope.{encodings,search,workers}` from a built wheel, not only editable."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE_FOLDERS = {"encodings": "longrope/encodings", "search": "longrope/search", "workers": "longrope/workers"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (built,) = out.glob("longrope_search-*.whl")
    return built


@pytest.mark.slow
def test_wheel_holds_every_module(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder, package in CODE_FOLDERS.items():
        for module in (ROOT / folder).rglob("*.py"):
            inside = module.relative_to(ROOT / folder).as_posix()
            assert f"{package}/{inside}" in names, f"{module} missing from the wheel (pyproject.toml packages?)"
    for data in ("config.json", "model.safetensors"):
        assert f"longrope/workers/reference_model/{data}" in names, f"reference model {data} missing from the wheel"
        for encoding in ("sinusoidal", "learned", "alibi", "cope", "nope", "rope"):
            assert f"longrope/workers/suite_models/{encoding}/{data}" in names, f"{encoding} {data} not in the wheel"
    assert "longrope/workers/suite_models/demo_factors.json" in names
    assert not any(name.startswith(("encodings/", "longrope/__init__")) for name in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "longrope = longrope.search.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


@pytest.mark.slow
def test_normal_install_works_from_any_directory(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    probe = (
        "import encodings, json, longrope.encodings as e, longrope.search.cli as cli;"
        "from longrope.workers.reference_recipe import reference_model_dir as d;"
        "assert (d() / 'model.safetensors').is_file(), d();"
        "print(json.dumps([encodings.__file__, e.__file__, cli.__file__]))"
    )
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    result = run_installed(["-c", probe], target, workdir)
    assert result.returncode == 0, result.stderr
    stdlib_codecs, ours, cli = json.loads(result.stdout)
    assert Path(stdlib_codecs).parent.parent == Path(json.__file__).parent.parent  # the stdlib's `encodings`
    assert Path(ours).is_relative_to(target) and Path(cli).is_relative_to(target)
    listing = run_installed(["-m", "longrope.search.cli", "encodings", "list", "--json"], target, workdir)
    assert listing.returncode == 0, listing.stderr
    assert "longrope" in {m["name"] for m in json.loads(listing.stdout)}


def run_installed(args: list[str], target: Path, workdir: Path) -> subprocess.CompletedProcess:
    """This interpreter with only the normal install at `target` on its path, run from another directory."""
    env = {"PYTHONPATH": str(target), "PATH": ""}
    return subprocess.run([sys.executable, *args], cwd=workdir, capture_output=True, text=True, env=env, timeout=300)
