"""Write a release's fixtures: run directories of every optimizer, finished and killed, written by that release.

Run once when a release is cut, with that release's code installed (`make install`), from the repository root:

    .venv/bin/python tests/release_fixtures.py 1.0.0

It writes tests/fixtures/releases/<version>/: per fixture a run directory `<name>/` (the shipped reference model,
`corpus:` data, embedded Ray, tiny searches of configs/demo.yaml), `<name>.status.json` (`longrope status --json`)
and `<name>.export.json` (`longrope export`), and for a run killed mid-generation `<name>.resumed.export.json`,
what that release exported after resuming a copy to its end; and shapes.json, the release's run-file shapes
(`run_file_shapes`). tests/test_release_runs.py then holds every later release to reading them. A killed run is
started in its own session and its process group SIGKILLed once history.jsonl holds `records` results of
generation `generation`, so its history ends inside that generation and its state.json is from the one before.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import run_file_shapes

LONGROPE = shutil.which("longrope", path=str(Path(sys.executable).parent))
ROOT = Path(__file__).resolve().parents[1]
SMALL = {
    "search.population": 8,
    "search.parents": 4,
    "search.mutations": 2,
    "search.crossovers": 2,
    "search.generations": 2,
    "data.search_windows": 2,
    "data.test_windows": 2,
    "workers.num_workers": 1,
}
KILLABLE = SMALL | {
    "search.mutations": 3,
    "search.crossovers": 3,
    "search.generations": 3,
    "workers.candidates_per_forward": 1,
    "workers.batch_size": 1,
}
CMAES = {"search.optimizer": "cmaes", "search.cmaes.generations": 2, "search.cmaes.population": 4}
DESCENT = {
    "search.optimizer": "gradient",
    "data.search_windows": 3,
    "search.gradient.steps": 3,
    "search.gradient.holdout_windows": 1,
}
HYBRID = {
    "search.optimizer": "hybrid",
    "data.search_windows": 3,
    "search.gradient.polish_steps": 2,
    "search.gradient.holdout_windows": 1,
}
SCREENED = {"search.surrogate.enabled": "true"}


@dataclass(frozen=True)
class Fixture:
    name: str
    settings: dict
    kill: tuple[int, int] | None = None  # (generation, records of it): SIGKILL once history.jsonl holds them


FIXTURES = (
    Fixture("ga", SMALL),
    Fixture("ga-killed", KILLABLE, kill=(1, 2)),
    Fixture("steady-killed", KILLABLE | {"search.schedule": "steady"}, kill=(1, 2)),
    Fixture("screened", SMALL | SCREENED),
    Fixture("screened-killed", KILLABLE | SCREENED, kill=(1, 2)),
    Fixture("cmaes", SMALL | CMAES),
    Fixture("cmaes-killed", KILLABLE | CMAES | {"search.cmaes.generations": 3}, kill=(1, 2)),
    Fixture("descent", SMALL | DESCENT),
    Fixture("descent-killed", KILLABLE | DESCENT | {"search.gradient.steps": 4}, kill=(2, 1)),
    Fixture("hybrid", SMALL | HYBRID),
    Fixture("hybrid-killed", KILLABLE | HYBRID | {"search.gradient.polish_steps": 3}, kill=(4, 1)),
    Fixture("staged", SMALL | {"search.stages": "[256,512]"}),
)


def search_command(fixture: Fixture, out: Path) -> list[str]:
    settings = [f"{key}={value}" for key, value in (fixture.settings | {"output_dir": str(out)}).items()]
    return [
        LONGROPE,
        "search",
        "--no-progress",
        str(ROOT / "configs" / "demo.yaml"),
        *[arg for s in settings for arg in ("--set", s)],
    ]


def records_of(history: Path, generation: int) -> int:
    if not history.exists():
        return 0
    lines = [json.loads(line) for line in history.read_text().splitlines() if line.endswith("}")]
    return sum(1 for line in lines if line.get("generation") == generation)


def run_killed(command: list[str], out: Path, generation: int, records: int) -> None:
    process = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while process.poll() is None and records_of(out / "history.jsonl", generation) < records:
        time.sleep(0.005)
    if process.poll() is not None:
        sys.exit(f"{out.name}: ended before it could be killed ({process.stderr.read().decode()[-500:]})")
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def longrope(*args: str) -> str:
    done = subprocess.run([LONGROPE, *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"longrope {' '.join(args)}: {done.stderr[-1000:]}")
    return done.stdout


def write_fixture(fixture: Fixture, folder: Path, scratch: Path) -> None:
    out = scratch / fixture.name
    command = search_command(fixture, out)
    if fixture.kill:
        run_killed(command, out, *fixture.kill)
    else:
        subprocess.run(command, check=True, capture_output=True)
    for cache in out.rglob("windows-cache"):
        shutil.rmtree(cache)
    shutil.copytree(out, folder / fixture.name)
    (folder / f"{fixture.name}.status.json").write_text(longrope("status", str(out), "--json"))
    longrope("export", str(out), "-o", str(folder / f"{fixture.name}.export.json"))
    if fixture.kill:
        longrope("search", "--no-progress", "--resume", str(out))
        longrope("export", str(out), "-o", str(folder / f"{fixture.name}.resumed.export.json"))
    print(f"{fixture.name}: written", flush=True)


def main(version: str) -> None:
    folder = run_file_shapes.RELEASES / version
    if folder.exists():
        sys.exit(f"{folder} exists: a release's fixtures are written once")
    folder.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="longrope-release-") as scratch:
        for fixture in FIXTURES:
            write_fixture(fixture, folder, Path(scratch))
    run_file_shapes.write_snapshot(version)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/release_fixtures.py VERSION")
    main(sys.argv[1])
