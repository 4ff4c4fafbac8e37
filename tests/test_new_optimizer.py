"""Adding an optimizer is one module and one registry entry, plus its settings model when it has settings.

The proof writes a real module, a random search with a config section of its own, into a temporary copy of the
package, adds its entry to `factory.SEARCHERS` there, and runs the CLI on that copy: a config error in its
section, a search, a search killed mid-generation and resumed to the uninterrupted result, `status` and `export`;
then the guards that hold every module (the import graph) and every run file (the release's shapes) pass on the copy
as they are. The base class's docstring example runs too."""

from __future__ import annotations

import doctest
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from longrope.search.optimizers import searcher as searcher_module
from longrope.search.optimizers.searcher import Searcher

ROOT = Path(__file__).resolve().parents[1]
LONGROPE = shutil.which("longrope", path=str(Path(sys.executable).parent))
MODULE = '''"""Random search: the seeds, then `search.random.samples` random monotone factor vectors per generation."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from longrope.search.config.strict import Strict
from longrope.search.optimizers.searcher import GenerationEnd, Searcher, SearchPlan, best_score


class RandomSettings(Strict):
    samples: int = Field(default=4, ge=1, le=1000, description="random candidates per generation")
    generations: int = Field(default=2, ge=0, le=1000, description="generations after the seeds")


class RandomSearch(Searcher):
    kind = "random"
    settings_model = RandomSettings

    def __init__(self, settings, grid, seeds):
        super().__init__(settings, grid, seeds)
        self.options = settings.optimizer_settings()
        self.out, self.told = {}, {}

    @staticmethod
    def plan(search, seeds):
        options = search.optimizer_settings()
        return SearchPlan(seeds + options.generations * options.samples, 0, "the seeds, then samples x generations")

    @staticmethod
    def generations_range(search):
        return 1 + search.optimizer_settings().generations, 1 + search.optimizer_settings().generations

    def ask(self, count):
        if self.out or self.done():
            return []
        rng = np.random.default_rng([self.settings.seed, self.generation])  # per generation: a replay draws the same
        top = self.grid.high * self.grid.step
        draws = [np.sort(rng.uniform(1.0, top, self.grid.pairs)) for _ in range(self.options.samples)]
        genomes = [self.grid.from_seed(s) for s in self.seeds] if self.generation == 0 else [
            self.grid.genome(factors) for factors in draws
        ]
        self.out = {genome.key: self.grid.candidate(genome, self.generation) for genome in genomes}
        return list(self.out.values())

    def tell(self, results):
        previous = self.best()[1] if self.told else float("inf")
        for result in results:
            self.out.pop(result.key, None)
            self.told[result.key] = result.score
        if self.out:
            return []
        self.generation += 1
        label = f"generation {self.generation - 1}/{self.total_generations - 1}"
        return [GenerationEnd(label, self.generation - 1, self.best()[1], previous)]

    def best(self):
        return best_score(self.told)
'''
SMALL = {
    "search.optimizer": "random",
    "search.random.samples": 3,
    "search.random.generations": 3,
    "data.search_windows": 2,
    "data.test_windows": 2,
    "workers.num_workers": 1,
    "workers.candidates_per_forward": 1,  # each score computed alone: bit-identical however a run batches
    "workers.batch_size": 1,
}


def test_the_base_class_docstring_example_runs():
    result = doctest.testmod(searcher_module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 5 and result.failed == 0


def test_the_base_class_asks_for_ask_tell_and_plan():
    class NoTell(Searcher):
        kind = "no_tell"

        def ask(self, count):
            return []

        @staticmethod
        def plan(search, seeds):
            return None

    with pytest.raises(TypeError, match="tell"):
        NoTell(None, None, [])


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory) -> Path:
    """The package's three folders copied under `longrope/`, the random search written in, its registry entry
    added: importable ahead of the installed package with PYTHONPATH."""
    root = tmp_path_factory.mktemp("copy")
    for folder in ("search", "encodings", "workers"):
        shutil.copytree(ROOT / folder, root / "longrope" / folder, ignore=shutil.ignore_patterns("__pycache__"))
    optimizers = root / "longrope" / "search" / "optimizers"
    (optimizers / "random_search.py").write_text(MODULE)
    factory = optimizers / "factory.py"
    text = factory.read_text()
    entry = "for _searcher in (DimMonoEvolution, CmaesOptimizer, GradientDescent, HybridSearch):"
    assert text.count(entry) == 1, "the registry entry's line moved: update this test"
    text = text.replace(entry, entry.replace("HybridSearch)", "HybridSearch, RandomSearch)"))
    import_line = "from longrope.search.optimizers.random_search import RandomSearch\n"
    factory.write_text(
        text.replace(
            "from longrope.search.optimizers.searcher", import_line + "from longrope.search.optimizers.searcher", 1
        )
    )
    return root


def longrope(copy: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(copy)}
    done = subprocess.run([LONGROPE, *args], capture_output=True, text=True, env=env, cwd=ROOT)
    assert not check or done.returncode == 0, done.stderr[-2000:]
    return done


def search_args(out: Path, **more) -> list[str]:
    settings = {**SMALL, **more, "output_dir": str(out)}
    return [
        "search",
        "--no-progress",
        "configs/demo.yaml",
        *[arg for k, v in settings.items() for arg in ("--set", f"{k}={v}")],
    ]


def history_of(run: Path) -> list[dict]:
    path = run / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")] if path.exists() else []


def test_the_copy_imports_the_new_module(package_copy):
    probe = "import longrope.search.optimizers.factory as f; print(f.SEARCHERS['random'].__module__, f.__file__)"
    env = {**os.environ, "PYTHONPATH": str(package_copy)}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == [
        "longrope.search.optimizers.random_search",
        str(package_copy / "longrope/search/optimizers/factory.py"),
    ]


def test_its_section_is_checked_like_every_other(package_copy, tmp_path):
    bad = longrope(package_copy, *search_args(tmp_path / "run", **{"search.random.samples": 0}), check=False)
    assert bad.returncode == 2
    assert (
        bad.stderr.strip()
        .splitlines()[-1]
        .endswith("search.random.samples: Input should be greater than or equal to 1")
    )
    unknown = longrope(package_copy, *search_args(tmp_path / "run", **{"search.random.draws": 3}), check=False)
    assert unknown.returncode == 2 and "search.random.draws: unknown field (value 3)" in unknown.stderr
    assert not (tmp_path / "run").exists()


def test_its_section_is_written_in_full_and_set_merges_into_it(package_copy, tmp_path):
    """The configured optimizer's section is in the resolved config whole (its defaults where left out: what the
    run did stays in config.json whatever the defaults become), and `--set search.random={...}` merges into it."""
    (tmp_path / "job.yaml").write_text("target_length: 256\nsearch:\n  optimizer: random\n  random:\n    samples: 5\n")
    probe = (
        "import json, sys; from longrope.search.optimizers.factory import load_job_config; "
        "print(json.dumps(load_job_config(sys.argv[1], sys.argv[2:]).search.model_dump(mode='json')['random']))"
    )
    env = {**os.environ, "PYTHONPATH": str(package_copy)}

    def section(*sets: str) -> dict:
        command = [sys.executable, "-c", probe, str(tmp_path / "job.yaml"), *sets]
        return json.loads(subprocess.run(command, capture_output=True, text=True, env=env, check=True).stdout)

    assert section() == {"samples": 5, "generations": 2}
    assert section("search.random={generations: 7}") == {"samples": 5, "generations": 7}


@pytest.mark.slow
def test_a_search_a_kill_a_resume_status_and_export_with_it(package_copy, tmp_path):
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    longrope(package_copy, *search_args(clean))
    recorded = history_of(clean)
    assert len(recorded) == 3 + 3 * 3 and {r["generation"] for r in recorded} == {0, 1, 2, 3}
    config = json.loads((clean / "config.json").read_text())["config"]["search"]
    assert config["random"] == {"samples": 3, "generations": 3}, "its section is written where the user put it"

    env = {**os.environ, "PYTHONPATH": str(package_copy)}
    process = subprocess.Popen(
        [LONGROPE, *search_args(killed)],
        env=env,
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while process.poll() is None and sum(r["generation"] == 2 for r in history_of(killed)) < 1:
        time.sleep(0.005)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert len(history_of(killed)) < len(recorded), "killed before the end"
    longrope(package_copy, "search", "--no-progress", "--resume", str(killed))
    lines = history_of(killed)
    assert len(lines) == len({r["key"] for r in lines}) == len(recorded), "no key twice, none lost"
    assert {r["key"]: r["mean_nll"] for r in lines} == {r["key"]: r["mean_nll"] for r in recorded}

    status = json.loads(longrope(package_copy, "status", str(killed), "--json").stdout)
    assert (status["optimizer"], status["finished"]) == ("random", True)
    exports = [longrope(package_copy, "export", str(run), "-o", str(run / "factors.json")) for run in (clean, killed)]
    assert all(done.returncode == 0 for done in exports)
    factors = [json.loads((run / "factors.json").read_text()) for run in (clean, killed)]
    assert factors[0]["rope_parameters"] == factors[1]["rope_parameters"]
    assert factors[1]["provenance"]["best_key"] == min(recorded, key=lambda r: (r["mean_nll"], r["key"]))["key"]


def test_the_guards_pass_on_the_copy_as_they_are(package_copy):
    """The import graph's rules and the release's run-file shapes, run on the copy: a new optimizer owes neither
    a line in a doc nor a fixture (no run directory of a release holds its state)."""
    env = {
        **os.environ,
        "PYTHONPATH": f"{package_copy}{os.pathsep}{ROOT / 'tests'}",
        "LONGROPE_SOURCE_ROOT": str(package_copy / "longrope"),
    }
    tests = [str(ROOT / "tests" / name) for name in ("test_import_graph.py", "test_run_file_shapes.py")]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:]
