"""SmolLM2-135M read at 32k and 64k (4x and 8x its 8k) on one H200 in one lease: every baseline on 16 test windows at
each target, NTK and YaRN tuned, and a search: the GA screened by the surrogate (the mission's method) then polished
(the hybrid: one run, a row for the GA's best and one for the polished best) and descent, each at the budget the
measured forward time allows, with compare's table of every row.

Why a script of its own: a run on the GPU machine carries at most 64 MiB, the checkout (about 30 MB) included, and
the machine has neither Ray, pydantic nor gguf. So, here, `prepare` cuts the model's 98 MB GGUF into 4 parts of at
most 30 MB (bench/gpu_parts.py split) and the test and search windows in advance (bundle.json and
windows.safetensors: no tokenizer or corpus travels); the wheels come from `bash bench/gpu_wheels.sh` (.whl/). There,
one run per part appends it to /tmp/longrope-gpu/ (bench/gpu_parts.py join: missing or out-of-order parts refused
with one line, exit 2), and the run with the last part also runs `run`: the GGUF's sha256 checked, its weights
dequantized and checked against the reference directory's (gpu_table_parts/gguf_weights.py), the model loaded in
bfloat16 with SDPA, the forward and gradient pass timed at each target, the searches sized (gpu_table_parts/plan.py),
the table written after each part to $OUT/gpu_table.json (and gpu_table.md at the end).

The runs, with their carry and timeout, are printed by `sequence` and are bench/README.md's; `dry-run` executes the
same steps here, on a random tiny Llama quantized as SmolLM2 is and the shipped corpus (4x and 8x of 64 tokens), so
the sequence cannot rot (tests/test_gpu_table.py; bench/results/gpu_table_dry_run.json).

  bash bench/gpu_wheels.sh                                  # .whl/: pydantic and gguf for Python 3.12
  .venv/bin/python bench/gpu_table.py prepare               # runs/gpu-table/{parts,bundle}, then the runs
  .venv/bin/python bench/gpu_table.py dry-run               # the whole sequence on tiny shapes, here
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

from gpu_table_parts.device_runs import DEADLINE_S, PART_BYTES, STAGE, device_runs, readme_block  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SIZE = 98_362_432  # the pinned wheel's GGUF (search/downloads/model_wheels.py), checked by `prepare`
TARGETS = (32768, 65536)
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
    """The names `gpu_parts.py split` gives a file of `size` bytes."""
    return [f"{name}.{index:03d}" for index in range(max(1, math.ceil(size / max_bytes)))]


def prepare(args: argparse.Namespace) -> int:
    from gpu_table_parts.prepare import PrepareError, check_sizes, check_stage, prepare_stage, smollm2_gguf

    missing = [w for w in WHEELS if not any(p.name.startswith(w) for p in (ROOT / ".whl").glob("*.whl"))]
    if missing:
        print(
            f"error: .whl/ lacks {', '.join(m.rstrip('-_') for m in missing)}: bash bench/gpu_wheels.sh",
            file=sys.stderr,
        )
        return 2
    try:
        stage, model_dir = ROOT / args.stage, ROOT / args.model
        check_stage(stage)
        stage.mkdir(parents=True, exist_ok=True)
        gguf, source = smollm2_gguf(stage, model_dir)
        sources = {"search_source": args.search_source, "test_source": args.test_source}
        prepare_stage(
            gguf,
            source,
            model_dir,
            stage,
            sources=sources,
            original=8192,
            targets=list(TARGETS),
            search_windows=args.search_windows,
            test_windows=args.test_windows,
            seed=args.seed,
            max_bytes=PART_BYTES,
        )
        runs = device_runs(part_names(gguf.stat().st_size, PART_BYTES, gguf.name), gguf.name, stage=args.stage)
        check_sizes(runs)
    except PrepareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(readme_block(runs))
    return 0


def sequence(args: argparse.Namespace) -> int:
    """The runs bench/README.md gives, for the pinned GGUF's parts."""
    print(readme_block(device_runs(part_names(GGUF_SIZE, PART_BYTES, GGUF_NAME), GGUF_NAME, stage=STAGE)))
    return 0


def run(args: argparse.Namespace) -> int:
    from gpu_table_parts.run_table import run_table

    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print("error: no CUDA device: run it on the GPU machine, or --device cpu", file=sys.stderr)
            return 2
    return run_table(args)


def dry_run(args: argparse.Namespace) -> int:
    """The README's sequence on tiny shapes: the tiny GGUF and its reference directory made, `prepare`'s stage
    (3 parts), then each device run's steps executed here as on the GPU machine (GPU_LIKE), with local folders for
    /tmp/longrope-gpu and $OUT."""
    from gpu_table_parts import dry
    from gpu_table_parts.prepare import prepare_stage

    work = Path(args.work or tempfile.mkdtemp(prefix="gpu-table-dry-"))
    work.mkdir(parents=True, exist_ok=True)
    gguf = dry.tiny_gguf(work / "tiny.gguf")
    reference = dry.reference_dir(gguf, work / "reference")
    stage, out = work / "stage", work / "out"
    max_bytes = math.ceil(gguf.stat().st_size / 3)
    prepare_stage(
        gguf,
        "a random tiny Llama (bench/gpu_table_parts/dry.py)",
        reference,
        stage,
        sources=dry.SOURCES,
        original=dry.ORIGINAL,
        targets=list(dry.TARGETS),
        search_windows=4,
        test_windows=16,
        seed=0,
        max_bytes=max_bytes,
    )
    # capped searches, and room for a busy CPU: the test asks that both searches run, not how fast
    extra = ("--device", "cpu", "--max-generations", "2", "--max-steps", "2", "--slack", "4")
    runs = device_runs(
        part_names(gguf.stat().st_size, max_bytes, gguf.name),
        gguf.name,
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
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / "gpu_table.json", args.out)
        print(f"saved {args.out}")
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
    here = verbs.add_parser("prepare", help="here: the GGUF's parts and the bundle under --stage, then the runs")
    here.add_argument("--model", default="models/smollm2-135m", help="the reference directory (make real-model)")
    here.add_argument("--search-source", default="corpora/manuals/search")
    here.add_argument("--test-source", default="corpora/manuals/test")
    here.add_argument("--search-windows", type=int, default=4)
    here.add_argument("--test-windows", type=int, default=16)
    here.add_argument("--seed", type=int, default=0)
    here.add_argument("--stage", default=STAGE)
    here.set_defaults(call=prepare)
    verbs.add_parser("sequence", help="the runs bench/README.md gives").set_defaults(call=sequence)
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
    dry.add_argument("--work", help="default: a new temporary folder")
    dry.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_table_dry_run.json"))
    dry.add_argument("--deadline-s", type=int, default=300, help="the searches are capped at 2 generations or steps")
    dry.set_defaults(call=dry_run)
    redraw = verbs.add_parser("plot", help="here: the paired-difference plots beside a saved gpu_table.json")
    redraw.add_argument("result", help="e.g. bench/results/gpu_table.json")
    redraw.set_defaults(call=plot)
    args = parser.parse_args(argv)
    return args.call(args)


if __name__ == "__main__":
    sys.exit(main())
