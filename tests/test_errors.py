"""One error base class: every error the package raises for bad input or a run that cannot go on is a
LongRopeError, which the CLI prints as one line (exit 2); library errors keep the exception that caused them."""

from __future__ import annotations

import importlib
import inspect
import json

import pytest
from test_import_graph import module_files

from longrope.workers.errors import LongRopeError

# Exceptions of ours that are not "bad input": Ctrl-C / SIGTERM unwind as KeyboardInterrupt, and a position past an
# encoding's table is a caller's programming error (an IndexError), never something a user typed; a restarted actor
# that lost its windows says so to the pool, which sends them again (it never reaches the user).
NOT_USER_ERRORS = {"Terminated", "Stopped", "PositionOutOfRangeError", "WindowsMissing"}


def our_exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in the package's modules (Ray's and torch's imports happen as the CLI's do)."""
    found: dict[str, type[BaseException]] = {}
    for name in module_files():
        if name.endswith("__main__"):
            continue
        module = importlib.import_module(name)
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def test_every_error_of_ours_derives_from_the_one_base():
    classes = our_exception_classes()
    names = {name.rsplit(".", 1)[1] for name in classes}
    assert {"JobConfigError", "RunStoreError", "EncodingConfigError", "WorkerPoolError", "DataError"} <= names
    exempt = NOT_USER_ERRORS | {"LongRopeError"}
    strays = sorted(
        name
        for name, cls in classes.items()
        if name.rsplit(".", 1)[1] not in exempt and not issubclass(cls, LongRopeError)
    )
    assert strays == []
    assert names >= NOT_USER_ERRORS, "the exceptions named above still exist"


def test_the_cli_prints_a_library_error_as_one_line_and_the_library_keeps_its_cause(tmp_path, capsys):
    from longrope.search.cli.main import main
    from longrope.search.run.run_store import RunDir, RunStoreError

    (tmp_path / "config.json").write_text('{"config_hash": ')
    with pytest.raises(RunStoreError) as caught:
        RunDir(tmp_path).read_config()
    assert isinstance(caught.value.__cause__, json.JSONDecodeError), "the JSON parser's error stays as the cause"
    assert main(["status", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"longrope: error: {tmp_path / 'config.json'}: corrupted")
