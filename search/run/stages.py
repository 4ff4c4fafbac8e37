"""Progressive stages: one job that searches at increasing lengths, each stage seeded by the previous one's best.

LongRoPE reaches its longest windows in steps (arXiv 2402.13753, section 3.3: 128k, then 256k, then 2048k, each
search starting from the previous factors), because a good factor shape at 4x is a better start for 8x than
any closed form. A job with `search.stages: [L1, L2, ...]` runs a full search at L1, then L2, ..., then
`target_length`, each in its own run directory `stage-<k>-<length>` inside the job's `output_dir`; stage k+1
lists stage k's directory among its seed files, so its first generation holds stage k's best as it is and moved
to the new length (`JobContext.seeds_from_file`). The job's own directory holds its config.json; a resume
continues the first unfinished stage (finished ones are read, never scored again); export, status and compare
take the last stage.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from longrope.search.config.job_config import JobConfig
from longrope.search.config.loading import describe_errors
from longrope.search.config.strict import JobConfigError
from longrope.search.run.run_store import CONFIG, RunDir

STAGE_PREFIX = "stage-"


def stage_lengths(config: JobConfig) -> list[int]:
    return [*config.search.stages, config.target_length]


def stage_dir(output_dir: str | Path, index: int, length: int) -> Path:
    return Path(output_dir) / f"{STAGE_PREFIX}{index + 1}-{length}"


def stage_configs(config: JobConfig, output_dir: str | Path | None = None) -> list[JobConfig]:
    """One ordinary job config per stage, each writing to its stage directory and seeded by the one before."""
    root = Path(output_dir or config.output_dir).resolve()  # a stage's seed path must not depend on the cwd
    configs: list[JobConfig] = []
    previous: Path | None = None
    for index, length in enumerate(stage_lengths(config)):
        raw = config.model_dump(mode="json")
        raw["search"]["stages"] = []
        raw["search"]["seed_files"] = [*config.search.seed_files, *([str(previous)] if previous else [])]
        previous = stage_dir(root, index, length)
        try:
            configs.append(JobConfig.model_validate({**raw, "target_length": length, "output_dir": str(previous)}))
        except ValidationError as exc:
            message = describe_errors(exc, f"search.stages: stage {index + 1} at {length} tokens")
            raise JobConfigError(message) from exc
    return configs


def is_staged(run_dir: RunDir) -> bool:
    """A job directory of stages (its config lists stages), not a run directory of its own."""
    return run_dir.file(CONFIG).is_file() and bool(run_dir.read_config().search.stages)


def stage_run_dirs(run_dir: RunDir) -> list[RunDir]:
    """A staged job's stage directories, in order, started or not."""
    lengths = stage_lengths(run_dir.read_config())
    return [RunDir(stage_dir(run_dir.path, k, n)) for k, n in enumerate(lengths)]


def last_stage(run_dir: RunDir) -> RunDir:
    """The run directory export and compare read for a staged job: the last stage, once it has started."""
    return stage_run_dirs(run_dir)[-1]


def started_stages(run_dir: RunDir) -> list[RunDir]:
    return [folder for folder in stage_run_dirs(run_dir) if folder.file(CONFIG).is_file()]
