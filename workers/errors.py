"""Errors of the scoring side, each naming what is wrong and the value found."""


class ModelLoadError(ValueError):
    """A model directory is missing, unreadable, or holds a model the rope patch cannot drive."""


class DataError(ValueError):
    """Documents are missing, unreadable, or too few / too short for the requested windows."""


class WorkerPoolError(RuntimeError):
    """The worker pool cannot go on (no worker left, Ray unreachable)."""
