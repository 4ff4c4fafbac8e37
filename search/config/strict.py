"""What every section of the job config shares: strict pydantic (unknown fields, NaN and inf refused; frozen), the
limits on values, the path check, and the one error a bad value becomes (`JobConfigError`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

from longrope.workers.path_limits import path_length_problem

SEED_METHODS = ("pi", "ntk", "yarn", "llama3")
MAX_LENGTH = 1 << 26  # 67M tokens: past every published context window, far below int32/int64 trouble
MAX_SEED = (1 << 63) - 1  # numpy's PCG64 takes a non-negative integer
MAX_COUNT = 1_000_000  # populations, generations, windows: larger is a typo, not a job
MIN_GRID_STEP = 1e-4  # factors live on an integer grid: (max_factor / grid_step) steps must stay countable
MAX_FACTOR = 1e4
N_HAT_CHOICES = (0, 1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 64, 128, 256)
REFERENCE_MODEL = "reference"  # model.path naming the reference model that ships with the package


class JobConfigError(ValueError):
    """A job config (file, override or resolved value) is invalid; the message names every bad field."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


def checked_os_path(value: str, room: int = 0) -> str:
    """A path field the OS will take (workers/path_limits.py): refused here, before anything is opened or written."""
    problem = path_length_problem(value, room=room)
    if problem:
        raise ValueError(problem)
    return value


PathText = Annotated[str, AfterValidator(checked_os_path)]
