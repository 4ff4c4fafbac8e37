"""What the benchmark scripts share: where results go and what each records about its run, the candidates they
time, the random Llama they time at a realistic width, the one-window job, and a run's cost trajectory (the package's
`longrope.search.run.trajectory`, which `longrope status --plot` draws, re-exported here for the scripts).

The scripts run as `.venv/bin/python bench/NAME.py`, which puts bench/ on the import path, so they import this
module as `benchlib` and never each other (a script's module-level state stays its own). Timing itself is
`longrope.workers.timing`, shared with `longrope estimate`.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from longrope.encodings import LongRope, NtkRope, YarnRope
from longrope.search.config.job_config import JobConfig
from longrope.search.optimizers.factory import load_job_config
from longrope.search.run.trajectory import CostPoint as CostPoint  # re-exported: the scripts import it from here
from longrope.search.run.trajectory import cost_trajectory
from longrope.workers.random_llama import llama_config, save_random_llama

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


# ---- what a saved result records ----


def machine() -> dict[str, Any]:
    """The machine and software the figures were measured on (the load average: how shared the machine was)."""
    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": installed_version("ray"),
        "torch_threads_of_this_process": torch.get_num_threads(),
        "load_average_1_5_15": list(os.getloadavg()),
    }


def installed_version(package: str) -> str | None:
    """None where the package is not installed (the GPU machine has no Ray: bench/gpu_check.py)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if "model name" in line:
                return line.split(":", 1)[1].strip()
    return platform.processor()


def command() -> str:
    """This run's command line, as the docs write it (`.venv/bin/python bench/NAME.py ARGS`)."""
    return " ".join([".venv/bin/python", f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]])


def provenance() -> dict[str, Any]:
    """The command, the date (UTC), the commit (and whether tracked files differ from it) and the machine: what
    every saved result starts with."""
    commit, changed = git_output("rev-parse", "HEAD"), git_output("status", "--porcelain", "--untracked-files=no")
    return {
        "command": command(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "uncommitted_changes": None if changed is None else bool(changed),
        "machine": machine(),
    }


def git_output(*args: str) -> str | None:
    """A git command's output in this checkout; None where there is no git or no repository (a copy of the
    working tree on the GPU machine)."""
    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def run_status(run: Path) -> dict[str, Any]:
    """A run directory's `longrope status --json`: what its search spent (window evaluations, forward and backward
    window passes) and found, as users read it."""
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "longrope"), "status", str(run), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def save_json(path: Path, result: dict[str, Any]) -> Path:
    """`result` as indented JSON at `path` (its folder made), with the load average at the end of the run."""
    result.setdefault("machine", {})["load_average_at_end"] = list(os.getloadavg())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"saved {path}")
    return path


# ---- what the scoring benchmarks time ----


def candidate_set(count: int, rope, target: int) -> list[LongRope]:
    """`count` LongRoPE candidates for the model whose RoPE is `rope` (`models.ModelRope`), read at `target`:
    factors from 1 rising linearly to 1.5, 2.0, ... across the pairs, so no two are alike."""
    pairs = rope.rotary_dim // 2
    return [
        LongRope.from_factors(
            torch.linspace(1.0, 1.0 + 0.5 * (i + 1), pairs),
            head_dim=rope.head_dim,
            original_length=rope.original_length,
            target_length=target,
        )
        for i in range(count)
    ]


def ranking_candidates(rope, target: int, near_ties: int, seed: int = 0) -> dict[str, LongRope]:
    """Candidates that span bad to good factors and candidates a converging search tells apart, for the model whose
    RoPE is `rope` (`models.ModelRope`) read at `target` (scale s = target / original length): PI (s everywhere),
    NTK-aware and YaRN's factors at s, each with attention factor 1 and 1.2; power curves 1 + (s - 1) t^p across
    the pairs (p = 0.5, 1, 2, 3); and `near_ties` children of YaRN's factors, each factor times exp(N(0, 0.006)) and
    the attention factor 1.2 + N(0, 0.003) (numpy's generator, `seed`): as close as a GA's late children are."""
    scale = target / rope.original_length
    pairs = rope.rotary_dim // 2
    shape = {"head_dim": rope.head_dim, "max_position_embeddings": target, "rope_theta": rope.rope_theta}
    closed = {
        "pi": np.full(pairs, scale),
        "ntk": NtkRope(factor=scale, **shape).factors().double().numpy(),
        "yarn": YarnRope(factor=scale, original_max_position_embeddings=rope.original_length, **shape)
        .factors()
        .double()
        .numpy(),
    }
    steps = np.linspace(0.0, 1.0, pairs)
    factors = {f"{name}/{a}": (f, a) for name, f in closed.items() for a in (1.0, 1.2)}
    factors |= {f"power {p}": (1.0 + (scale - 1.0) * steps**p, 1.2) for p in (0.5, 1.0, 2.0, 3.0)}
    rng = np.random.default_rng(seed)
    for k in range(near_ties):
        child = np.clip(closed["yarn"] * np.exp(rng.normal(0.0, 0.006, pairs)), 1.0, None)
        factors[f"near tie {k}"] = (child, 1.2 + rng.normal(0.0, 0.003))
    return {
        name: LongRope.from_factors(
            torch.from_numpy(f),
            head_dim=rope.head_dim,
            original_length=rope.original_length,
            target_length=target,
            rope_theta=rope.rope_theta,
            attention_factor=float(a),
        )
        for name, (f, a) in factors.items()
    }


def d1024_llama(out: Path) -> Path:
    """A random-weight Llama at a realistic width: d_model 1024, 2 layers, 8 heads x 128, 4 key/value heads,
    MLP 2816, 32k vocabulary (what estimate_accuracy.py and backward_cost.py time at 2048 tokens and more)."""
    config = llama_config(
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=128,
        vocab_size=32000,
        max_position_embeddings=1024,
    )
    return save_random_llama(out, config)


def one_window_config(tokens: int, original: int, model: str = "reference") -> JobConfig:
    """A job that scores one candidate a call on one window of `tokens`: each forward is one row, its smallest."""
    base = {
        "target_length": tokens,
        "original_length": original,
        "model": {"path": model, "device": "cpu"},
        "data": {"search_windows": 1},
        "workers": {"candidates_per_forward": 1, "batch_size": 1},
    }
    return load_job_config(None, base=base)


# ---- a search run's cost, read back from its history.jsonl (`longrope.search.run.trajectory`) ----


def history_trajectory(run_dir: Path) -> list[tuple[int, float]]:
    """(window evaluations so far, best fully scored NLL so far) after each history line, in the order written
    (window evaluations are forward windows)."""
    return [(point.forward, point.best_nll) for point in cost_trajectory(run_dir, 0.0)]
