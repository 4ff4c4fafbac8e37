"""A model's table on one GPU in one lease, `--model` choosing which (gpu_table_parts/profiles.py): SmolLM2-135M read
at 32k and 64k (4x and 8x its 8k), every baseline on 16 test windows at each target, NTK and YaRN tuned, and a search:
the GA screened by the surrogate (the mission's method) then polished (the hybrid: one run, a row for the GA's best
and one for the polished best) and descent, each at the budget the measured forward time allows, with compare's table
of every row; or Gemma 3 270M read at 64k and 128k (2x and 4x its 32k), every baseline, the model as shipped, NTK and
YaRN tuned and descent, on 8 and 4 test windows. One lease holds one model's table (bench/README.md: the arithmetic).

Why a script of its own: a run on the GPU machine carries at most 64 MiB, the checkout (about 32 MB) included, and
the machine has neither Ray, pydantic nor gguf. So, here, `prepare` cuts the model's GGUF (SmolLM2's 98 MB, Gemma 3's
253 MB) into parts of at most 30 MB (bench/gpu_parts.py split) and the test and search windows in advance (bundle.json
and windows.safetensors: no tokenizer or corpus travels); the wheels come from `bash bench/gpu_wheels.sh` (.whl/).
There, one run per part appends it to /tmp/longrope-gpu/ (bench/gpu_parts.py join: missing or out-of-order parts
refused with one line, exit 2), and the run with the last part also runs `run`: the GGUF's sha256 checked, its weights
dequantized and checked against the reference directory's (gpu_table_parts/gguf_weights.py), the model loaded in
bfloat16 with SDPA (Gemma 3's local layers: the scorer's blockwise attention), the forward and gradient pass timed at
each target, the searches sized (gpu_table_parts/plan.py), the table written after each part to $OUT/gpu_table.json
or gpu_table_gemma3.json (and .md at the end).

The runs, with their carry and timeout, are printed by `sequence` and are bench/README.md's; `dry-run` executes the
same steps here, on a random tiny model of the same architecture, quantized as the real file is (a Llama at 4x and 8x
of 64 tokens; a Gemma 3 with local and global layers at 2x and 4x of 128) and the shipped corpus, so the sequence
cannot rot (tests/test_gpu_table.py; bench/results/gpu_table_dry_run.json, gpu_table_gemma3_dry_run.json).

  bash bench/gpu_wheels.sh                                           # .whl/: pydantic and gguf for Python 3.12
  .venv/bin/python bench/gpu_table.py prepare                        # runs/gpu-table/{parts,bundle}, then the runs
  .venv/bin/python bench/gpu_table.py prepare --model gemma3-270m    # runs/gpu-table-gemma3/...
  .venv/bin/python bench/gpu_table.py dry-run [--model gemma3-270m]  # the whole sequence on tiny shapes, here
"""

from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from checkout_package import importable_package

importable_package()

from gpu_table_parts.device_runs import DEADLINE_S, device_runs, readme_block  # noqa: E402
from gpu_table_parts.profiles import PROFILES, SMOLLM2, TableProfile  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# how the dry run starts each step: as on the GPU machine, with no installed package (the checkout's shim links it,
# checkout_package.py) and no Ray (`import ray` fails: nothing the GPU run imports needs it)
GPU_LIKE = """import os, runpy, sys
class NoRay:
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ModuleNotFoundError("no Ray on the GPU machine", name=name)
sys.meta_path = [NoRay()] + [finder for finder in sys.meta_path if "editable" not in repr(finder)]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
runpy.run_path(sys.argv[0], run_name="__main__")
"""
WHEELS = ("pydantic-", "pydantic_core-", "annotated_types-", "typing_inspection-", "typing_extensions-", "gguf-")


def part_names(size: int, max_bytes: int, name: str) -> list[str]:
    """The names `gpu_parts.py split` gives a file of `size` bytes (equal or full parts: as many either way)."""
    return [f"{name}.{index:03d}" for index in range(max(1, math.ceil(size / max_bytes)))]


def profile_runs(profile: TableProfile, **where) -> list:
    """The device runs of a profile's pinned GGUF, as bench/README.md gives them (`where`: the dry run's folders)."""
    parts = part_names(profile.gguf_size, where.pop("max_bytes", profile.part_bytes), profile.gguf_name)
    return device_runs(
        parts, profile.gguf_name, stage=where.pop("stage", profile.stage), result=profile.result, **where
    )


def prepare(args: argparse.Namespace) -> int:
    from gpu_table_parts.prepare import PrepareError, check_sizes, check_stage, prepare_stage, wheel_gguf

    missing = [w for w in WHEELS if not any(p.name.startswith(w) for p in (ROOT / ".whl").glob("*.whl"))]
    if missing:
        print(
            f"error: .whl/ lacks {', '.join(m.rstrip('-_') for m in missing)}: bash bench/gpu_wheels.sh",
            file=sys.stderr,
        )
        return 2
    profile = PROFILES[args.model]
    counts = {
        field: {target: value for target in profile.targets}
        for field, value in (("search_windows", args.search_windows), ("test_windows", args.test_windows))
        if value is not None
    }
    stage_name = args.stage or profile.stage
    sources = {"search_source": args.search_source, "test_source": args.test_source}
    part_bytes = args.part_bytes or profile.part_bytes
    update = {**counts, "sources": sources, "stage": stage_name, "part_bytes": part_bytes}
    profile = profile.model_copy(update=update)
    try:
        stage, model_dir = ROOT / stage_name, ROOT / (args.reference or profile.reference)
        check_stage(stage)
        stage.mkdir(parents=True, exist_ok=True)
        gguf, source = wheel_gguf(profile.model, stage, model_dir)
        if gguf.stat().st_size != profile.gguf_size:
            raise PrepareError(f"{gguf}: {gguf.stat().st_size} bytes, profiles.py pins {profile.gguf_size}")
        prepare_stage(gguf, source, model_dir, stage, profile, seed=args.seed, max_bytes=part_bytes)
        runs = profile_runs(profile)
        check_sizes(runs)
    except PrepareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(readme_block(runs))
    return 0


def sequence(args: argparse.Namespace) -> int:
    """The runs bench/README.md gives, for the pinned GGUF's parts."""
    print(readme_block(profile_runs(PROFILES[args.model])))
    return 0


def run(args: argparse.Namespace) -> int:
    from gpu_table_parts.run_table import run_table

    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print("error: no CUDA device: run it on the GPU machine, or --device cpu", file=sys.stderr)
            return 2
    return run_table(args)


def dry_model(model: str, work: Path) -> tuple[TableProfile, Path, Path, str]:
    """(the dry profile, its tiny GGUF, its reference directory, what the GGUF is): the model's stand-in."""
    from gpu_table_parts import dry, dry_gemma3
    from gpu_table_parts.profiles import dry_profile

    if model == SMOLLM2.model:
        gguf, shape, what = dry.tiny_gguf(work / "tiny.gguf"), (dry.ORIGINAL, dry.TARGETS), "a random tiny Llama"
    else:
        gguf, what = dry_gemma3.tiny_gguf(work / "tiny-gemma3.gguf"), "a random tiny Gemma 3"
        shape = (dry_gemma3.ORIGINAL, dry_gemma3.TARGETS)
    profile = dry_profile(
        PROFILES[model],
        gguf_name=gguf.name,
        gguf_size=gguf.stat().st_size,
        original=shape[0],
        targets=shape[1],
    )
    return profile, gguf, dry.reference_dir(gguf, work / "reference"), f"{what} (bench/gpu_table_parts/)"


def dry_run(args: argparse.Namespace) -> int:
    """The README's sequence on tiny shapes: the tiny GGUF and its reference directory made, `prepare`'s stage
    (3 parts, as the profile cuts them), then each device run's steps executed here as on the GPU machine
    (GPU_LIKE), with local folders for /tmp/longrope-gpu and $OUT."""
    from gpu_table_parts.prepare import prepare_stage

    work = Path(args.work or tempfile.mkdtemp(prefix="gpu-table-dry-"))
    work.mkdir(parents=True, exist_ok=True)
    profile, gguf, reference, what = dry_model(args.model, work)
    stage, out = work / "stage", work / "out"
    # 3 parts: equal thirds, or (full parts) two of 40% and the rest, as the real profile cuts its GGUF
    max_bytes = math.ceil(gguf.stat().st_size * (0.4 if profile.full_parts else 1 / 3))
    prepare_stage(gguf, what, reference, stage, profile, seed=0, max_bytes=max_bytes)
    # capped searches, and room for a busy CPU: the test asks that every search runs, not how fast
    extra = ("--device", "cpu", "--max-generations", "2", "--max-steps", "2", "--slack", "4")
    runs = profile_runs(
        profile,
        max_bytes=max_bytes,
        stage=str(stage),
        into=str(work / "gpu"),
        out=str(out),
        deadline_s=args.deadline_s,
        extra=extra,
    )
    for number, device_run in enumerate(runs, 1):
        print(f"run {number} of {len(runs)} (carry {', '.join(Path(c).name for c in device_run.carry)})", flush=True)
        for step in device_run.steps:
            done = subprocess.run([sys.executable, "-u", "-c", GPU_LIKE, *step], cwd=ROOT)
            if done.returncode != 0:
                print(f"error: run {number}: {' '.join(step[:2])} exited {done.returncode}", file=sys.stderr)
                return done.returncode
    saved = Path(args.out or ROOT / "bench" / "results" / f"{profile.result}_dry_run.json")
    saved.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(out / f"{profile.result}.json", saved)
    print(f"saved {saved}")
    return 0


def plot(args: argparse.Namespace) -> int:
    """The paired-difference plot of each target of a saved result (the run draws them there; this redraws)."""
    from gpu_table_parts.run_table import TableResult, draw_paired_difference

    result = TableResult.model_validate_json(Path(args.result).read_text())
    for entry in result.targets.values():
        if entry.compare is not None:
            print(f"wrote {draw_paired_difference(entry, Path(args.result))}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    models = {"choices": sorted(PROFILES), "default": SMOLLM2.model, "help": "whose table (one lease each)"}
    here = verbs.add_parser("prepare", help="here: the GGUF's parts and the bundle under --stage, then the runs")
    here.add_argument("--model", **models)
    here.add_argument("--reference", help="the reference directory (default: the profile's, `longrope model get`)")
    here.add_argument("--search-source", default="corpora/manuals/search")
    here.add_argument("--test-source", default="corpora/manuals/test")
    here.add_argument("--search-windows", type=int, help="at every target (default: the profile's)")
    here.add_argument("--test-windows", type=int, help="at every target (default: the profile's)")
    here.add_argument("--seed", type=int, default=0)
    here.add_argument("--stage", help="default: the profile's (runs/gpu-table, runs/gpu-table-gemma3)")
    here.add_argument("--part-bytes", type=int, help="default: the profile's; smaller where a run would carry too much")
    here.set_defaults(call=prepare)
    listing = verbs.add_parser("sequence", help="the runs bench/README.md gives")
    listing.add_argument("--model", **models)
    listing.set_defaults(call=sequence)
    there = verbs.add_parser("run", help="there: the table, from the joined GGUF and the bundle")
    there.add_argument("--gguf", required=True)
    there.add_argument("--bundle", required=True)
    there.add_argument("--out", required=True)
    there.add_argument("--deadline-s", type=float, default=DEADLINE_S, help="from the script's start")
    there.add_argument("--device", default="cuda")
    there.add_argument("--work", help="where the converted model goes (default: beside the GGUF)")
    there.add_argument("--max-generations", type=int, default=40)
    there.add_argument("--max-steps", type=int, default=60)
    there.add_argument("--slack", type=float, default=1.25, help="a search may take this x its planned seconds")
    there.set_defaults(call=run)
    dry = verbs.add_parser("dry-run", help="here: the whole sequence on tiny shapes, on the CPU")
    dry.add_argument("--model", **models)
    dry.add_argument("--work", help="default: a new temporary folder")
    dry.add_argument("--out", help="default: bench/results/RESULT_dry_run.json (gpu_table, gpu_table_gemma3)")
    dry.add_argument("--deadline-s", type=int, default=300, help="the searches are capped at 2 generations or steps")
    dry.set_defaults(call=dry_run)
    redraw = verbs.add_parser("plot", help="here: the paired-difference plots beside a saved gpu_table.json")
    redraw.add_argument("result", help="e.g. bench/results/gpu_table.json")
    redraw.set_defaults(call=plot)
    args = parser.parse_args(argv)
    return args.call(args)


if __name__ == "__main__":
    sys.exit(main())
