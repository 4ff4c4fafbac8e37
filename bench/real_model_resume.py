"""Issue 39's resume check on the real model: the GA arm's own config (configs/smollm2-135m-16k-ga.yaml) at a cheap
point, run once straight through and once killed with SIGKILL in the middle of a generation and resumed, must end in
the same history, state and export.

Why a benchmark and not a test: it needs SmolLM2 and its corpus (`make real-model`), which CI does not download. The
tests kill the reference model's search at six points (tests/test_fault_injection.py); this checks the one thing
they cannot, that nothing about the real model's scoring (its bfloat16 forwards, the corpus's windows, the model's
own loader) makes a resumed run differ. The cheap point: 1k -> 2k instead of 8k -> 16k (a 2k window is about 1/10
of a 16k forward's cost here), a population of 6 and 2 generations; the kill lands inside generation 1, after
`--kill-at` history lines. Both runs write under runs/ (kept, so their files can be read afterwards):

  .venv/bin/python bench/real_model_resume.py

saves bench/results/smollm2_resume_check.json: whether the histories, state.json and the exports are equal, and
what each run cost.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from benchlib import RESULTS, ROOT, provenance, save_json

CONFIG = ROOT / "configs" / "smollm2-135m-16k-ga.yaml"
LONGROPE = str(ROOT / ".venv" / "bin" / "longrope")
CHEAP_POINT = [
    "original_length=1024",
    "target_length=2048",
    "search={population: 6, parents: 3, mutations: 2, crossovers: 2, generations: 2}",
    "workers={candidates_per_forward: 1}",
]


def search(run_dir: Path) -> subprocess.Popen:
    """`longrope search` on the GA config at the cheap point, in a process group of its own (so a kill reaches
    Ray's workers too)."""
    overrides = [arg for item in [*CHEAP_POINT, f"output_dir={run_dir}"] for arg in ("--set", item)]
    args = ["search", str(CONFIG), *overrides, "--no-progress"]
    return subprocess.Popen([LONGROPE, *args], cwd=ROOT, start_new_session=True)


def history_lines(run_dir: Path) -> list[str]:
    path = run_dir / "history.jsonl"
    return [line for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def run_through(run_dir: Path) -> float:
    started = time.monotonic()
    if search(run_dir).wait() != 0:
        raise SystemExit(f"the uninterrupted run in {run_dir} failed")
    return time.monotonic() - started


def killed_and_resumed(run_dir: Path, kill_at: int) -> dict:
    """SIGKILL to the whole process group once history.jsonl holds `kill_at` lines, then `--resume` to the end."""
    started, process = time.monotonic(), search(run_dir)
    while len(history_lines(run_dir)) < kill_at:
        if process.poll() is not None:
            raise SystemExit(f"the run in {run_dir} ended before {kill_at} history lines; nothing was killed")
        time.sleep(0.5)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    at_kill = history_lines(run_dir)
    if subprocess.run([LONGROPE, "search", "--resume", str(run_dir), "--no-progress"], cwd=ROOT).returncode != 0:
        raise SystemExit(f"the resume of {run_dir} failed")
    after = history_lines(run_dir)
    keys = [json.loads(line)["key"] for line in after]
    return {
        "lines_at_kill": len(at_kill),
        "lines_after_resume": len(after),
        # the resume kept every line written before the kill, byte for byte, and scored no candidate twice
        "kept_lines_before_kill": after[: len(at_kill)] == at_kill,
        "no_candidate_scored_twice": len(keys) == len(set(keys)),
        "seconds": time.monotonic() - started,
    }


def export(run_dir: Path) -> dict:
    out = subprocess.run([LONGROPE, "export", str(run_dir), "-o", "-"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"export of {run_dir}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def scored(run_dir: Path) -> dict[str, dict]:
    """The history by key, each line's parsed record (the order of lines follows arrival, which the two runs
    need not share)."""
    return {record["key"]: record for record in map(json.loads, history_lines(run_dir))}


def state_without_timing(run_dir: Path) -> dict:
    """state.json less what measures the wall clock (seconds per generation), which no two runs share."""
    state = json.loads((run_dir / "state.json").read_text())
    return {key: value for key, value in state.items() if not key.endswith("_seconds")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--kill-at",
        type=int,
        default=9,
        help="history lines before the kill (default: 9, inside generation 1: 3 seeds + 3 drawn make generation 0)",
    )
    args = parser.parse_args()
    straight, resumed = ROOT / "runs" / "smollm2-resume-straight", ROOT / "runs" / "smollm2-resume-killed"
    for run_dir in (straight, resumed):
        shutil.rmtree(run_dir, ignore_errors=True)
    straight_seconds = run_through(straight)
    kill = killed_and_resumed(resumed, args.kill_at)
    a, b = scored(straight), scored(resumed)
    exports = [export(run_dir) for run_dir in (straight, resumed)]
    if not kill["lines_at_kill"] < len(a):
        raise SystemExit(f"--kill-at {args.kill_at}: the run had ended when it was killed; nothing was resumed")
    result = {
        "cheap_point": CHEAP_POINT,
        "candidates": len(a),
        "killed_mid_generation": json.loads(history_lines(straight)[kill["lines_at_kill"]])["generation"]
        == json.loads(history_lines(straight)[kill["lines_at_kill"] - 1])["generation"],
        "kill": kill,
        "straight_seconds": straight_seconds,
        "same_history": a == b,
        "same_state": state_without_timing(straight) == state_without_timing(resumed),
        "same_export_factors": exports[0]["rope_parameters"] == exports[1]["rope_parameters"],
        "best_perplexity": [e["provenance"]["best_perplexity"] for e in exports],
    }
    save_json(RESULTS / "smollm2_resume_check.json", {**provenance(), "result": result})
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
