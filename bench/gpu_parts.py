"""A file too large for one device run, moved onto the GPU machine in parts: `split` here, `join` there.

A run on the GPU machine carries at most 64 MiB, the checkout (about 30 MB) included, and the GGUF of SmolLM2-135M is
98 MB; so `split` cuts a file into parts of at most `--max-bytes` (30 MB: a part, the checkout and the carried wheels
fit one run), all of one size, and writes manifest.json beside them (each part's size and sha256, and the whole
file's). `--full-parts` cuts them all `--max-bytes` but the last, which takes the rest: Gemma 3's 253 MB GGUF as 8
parts of 30 MB and one of 13 MB, beside which the last run carries the bundle. One run carries one part, and `join`
there appends it to the file being assembled under `--into`, a folder outside the checkout (/tmp/longrope-gpu):
ignored files and /tmp are kept between runs while the machine stays warm (30 s after each run), and a fresh machine
starts with neither. After the last part, the whole file's sha256 is
checked and the file takes its name.

`join` refuses, with one line naming the part and exit status 2, and writes nothing: a part that is missing, not in
the manifest, damaged (its sha256), or out of order (a part before it not yet appended, as on a fresh machine: the
line says which part is next). A part given again after it was appended (a run repeated after a transfer failed) is
a no-op. The assembled bytes are cut back to the parts recorded before each append, so a run killed mid-append
leaves nothing half-written.

Needs only pydantic (the GPU machine's copy is a carried wheel: bench/gpu_wheels.sh), no torch, so a run that only
joins a part takes seconds.

  python bench/gpu_parts.py split FILE --into DIR [--max-bytes 30000000] [--full-parts]     # here
  python3 bench/gpu_parts.py join DIR/FILE.000 --into /tmp/longrope-gpu      # there, one part a run
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

MANIFEST = "manifest.json"
MAX_BYTES = 30_000_000  # a part: 64 MiB a run, less the checkout (~30 MB) and the wheels (~3 MB)


class Part(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str  # FILE.000, FILE.001, ...: the order they are joined in
    size: int = Field(ge=1)
    sha256: str


class PartsManifest(BaseModel):
    """manifest.json beside the parts: the whole file and each part, in order."""

    model_config = ConfigDict(extra="forbid")

    file: str  # the whole file's name (the joined file's name there)
    size: int = Field(ge=1)
    sha256: str
    parts: list[Part]


class JoinState(BaseModel):
    """DIR/FILE.join.json on the GPU machine: which parts are in DIR/FILE.partial, in order (the file's sha256
    names the file they belong to)."""

    model_config = ConfigDict(extra="forbid")

    file: str
    sha256: str
    appended: list[str] = []
    complete: bool = False


class Refused(Exception):
    """One line for the user: what is wrong, naming the part."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while block := stream.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def write_atomic(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def split(path: Path, into: Path, max_bytes: int = MAX_BYTES, full: bool = False) -> PartsManifest:
    """Cut `path` into ceil(size / max_bytes) parts in `into`, with manifest.json: of equal size (the last a few bytes
    smaller), or, `full`, each `max_bytes` but the last."""
    if not path.is_file():
        raise Refused(f"FILE: {str(path)!r} does not exist")
    if into.exists() and any(into.iterdir()):
        raise Refused(f"--into: {str(into)!r} is not empty; give a new folder (nothing is overwritten)")
    size = path.stat().st_size
    count = max(1, math.ceil(size / max_bytes))
    part_size = max_bytes if full else math.ceil(size / count)
    into.mkdir(parents=True, exist_ok=True)
    parts = []
    with open(path, "rb") as stream:
        for index in range(count):
            data = stream.read(part_size)
            part = into / f"{path.name}.{index:03d}"
            part.write_bytes(data)
            parts.append(Part(name=part.name, size=len(data), sha256=hashlib.sha256(data).hexdigest()))
    manifest = PartsManifest(file=path.name, size=size, sha256=sha256_file(path), parts=parts)
    write_atomic(into / MANIFEST, manifest.model_dump_json(indent=1) + "\n")
    return manifest


def read_manifest(path: Path) -> PartsManifest:
    if not path.is_file():
        raise Refused(f"manifest: {str(path)!r} does not exist (carry it with the part)")
    try:
        return PartsManifest.model_validate_json(path.read_text())
    except ValueError as exc:
        raise Refused(f"manifest: {str(path)!r} is not a parts manifest ({str(exc).splitlines()[0]})") from exc


def joined_so_far(state_path: Path, partial: Path, whole: Path, manifest: PartsManifest) -> JoinState:
    """The parts already joined under the target folder: join.json's, trusted only as far as the bytes on disk
    hold them. Anything else starts the join afresh at the first part, which then rewrites FILE.partial from byte
    0. That covers no join.json, an unreadable one, one for another file of that name, a FILE.partial lost or
    shorter than its recorded parts, and a joined FILE removed or cut short: trusting the record there, the first
    part would answer "already appended", the next would find no bytes to append to, and only deleting the folder
    by hand would get the join going again. A joined FILE whose sha256 is the manifest's is complete whatever
    join.json says: a run killed after the last part was renamed into place, before join.json said so, would
    otherwise carry every part again."""
    fresh = JoinState(file=manifest.file, sha256=manifest.sha256)
    if whole.is_file() and whole.stat().st_size == manifest.size and sha256_file(whole) == manifest.sha256:
        return fresh.model_copy(update={"appended": [part.name for part in manifest.parts], "complete": True})
    try:
        state = JoinState.model_validate_json(state_path.read_bytes())
    except (OSError, ValueError):
        return fresh
    sizes = {part.name: part.size for part in manifest.parts}
    # a FILE.partial may run past its recorded parts (an append killed midway): the next append cuts it back
    intact = partial.is_file() and partial.stat().st_size >= sum(sizes.get(n, 0) for n in state.appended)
    return state if state.sha256 == manifest.sha256 and not state.complete and intact else fresh


def join(part_path: Path, into: Path, manifest_path: Path | None = None) -> str:
    """Append one part to into/FILE.partial (the file itself after the last part); returns what was done, a line."""
    manifest = read_manifest(manifest_path or part_path.parent / MANIFEST)
    names = [part.name for part in manifest.parts]
    if part_path.name not in names:
        raise Refused(f"part {part_path.name}: not a part of {manifest.file} (its parts: {names[0]} to {names[-1]})")
    index = names.index(part_path.name)
    part = manifest.parts[index]
    if not part_path.is_file():
        raise Refused(f"part {part.name}: missing, {str(part_path)!r} does not exist (carry it in this run)")
    state_path, partial = into / f"{manifest.file}.join.json", into / f"{manifest.file}.partial"
    state = joined_so_far(state_path, partial, into / manifest.file, manifest)
    if part.name in state.appended:
        return f"part {part.name}: already appended ({len(state.appended)} of {len(names)}); nothing to do"
    if index != len(state.appended):
        next_name = names[len(state.appended)]
        raise Refused(
            f"part {part.name}: out of order, {len(state.appended)} of {len(names)} parts of {manifest.file} appended "
            f"under {str(into)!r}, {next_name} is next (a fresh machine starts again at {names[0]})"
        )
    found = sha256_file(part_path)
    if found != part.sha256 or part_path.stat().st_size != part.size:
        raise Refused(f"part {part.name}: sha256 {found}, the manifest says {part.sha256} (damaged or another file)")
    done = sum(manifest.parts[k].size for k in range(index))
    into.mkdir(parents=True, exist_ok=True)
    with open(partial, "r+b" if index else "wb") as out:
        out.truncate(done)  # what a run killed mid-append left past the recorded parts
        out.seek(done)
        out.write(part_path.read_bytes())
        out.flush()
        os.fsync(out.fileno())
    state.appended.append(part.name)
    if index + 1 < len(names):
        write_atomic(state_path, state.model_dump_json(indent=1) + "\n")
        return f"part {part.name}: appended, {index + 1} of {len(names)} ({(done + part.size) / 1e6:.1f} MB)"
    whole = sha256_file(partial)
    if whole != manifest.sha256:
        raise Refused(f"{manifest.file}: sha256 {whole} after every part, the manifest says {manifest.sha256}")
    os.replace(partial, into / manifest.file)
    state.complete = True
    write_atomic(state_path, state.model_dump_json(indent=1) + "\n")
    return f"{manifest.file}: all {len(names)} parts joined, sha256 {whole[:16]}... checked: {into / manifest.file}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    cut = verbs.add_parser("split", help="here: FILE -> DIR/FILE.000 ... and DIR/manifest.json")
    cut.add_argument("file", type=Path)
    cut.add_argument("--into", type=Path, required=True)
    cut.add_argument("--max-bytes", type=int, default=MAX_BYTES)
    cut.add_argument("--full-parts", action="store_true", help="every part --max-bytes but the last (the rest)")
    glue = verbs.add_parser("join", help="there: append one part to DIR/FILE (manifest.json beside the part)")
    glue.add_argument("part", type=Path)
    glue.add_argument("--into", type=Path, required=True)
    glue.add_argument("--manifest", type=Path, help="default: manifest.json beside the part")
    args = parser.parse_args(argv)
    try:
        if args.verb == "split":
            manifest = split(args.file, args.into, args.max_bytes, args.full_parts)
            print(
                f"{manifest.file}: {len(manifest.parts)} parts of at most {manifest.parts[0].size} bytes in {args.into}"
            )
        else:
            print(join(args.part, args.into, args.manifest))
    except Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
