"""The run directory under faults: failed writes, a torn history line, two writers, damaged files."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys

import pytest
from rich.console import Console
from search_helpers import FunctionEvaluator, problem

from longrope.search.coordinator import Coordinator
from longrope.search.job_config import JobConfig
from longrope.search.run_store import RunDir, RunStoreError, write_json_atomic


def job(tmp_path, generations: int = 4) -> JobConfig:
    return JobConfig.model_validate(
        {"target_length": 256, "output_dir": str(tmp_path), "search": {"generations": generations, "seed": 2}}
    )


def coordinator(config: JobConfig, run_dir: RunDir, evaluator=None) -> Coordinator:
    return Coordinator(
        config.search,
        problem(),
        run_dir,
        evaluator or FunctionEvaluator(),
        console=Console(quiet=True),
        show_progress=False,
    )


def snapshot(folder) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture
def clean(tmp_path):
    config = job(tmp_path / "clean")
    run_dir = RunDir(tmp_path / "clean")
    run_dir.create(config)
    best = coordinator(config, run_dir).run()
    return run_dir, best


def test_atomic_write_keeps_the_mode_and_a_new_file_gets_the_umask(tmp_path):
    target = tmp_path / "config.json"
    target.write_text("{}")
    target.chmod(0o640)
    write_json_atomic(target, {"a": 1})
    assert stat.S_IMODE(target.stat().st_mode) == 0o640 and json.loads(target.read_text()) == {"a": 1}
    umask = os.umask(0o027)
    try:
        write_json_atomic(tmp_path / "new.json", [1])
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o640  # 0666 & ~027, not the temp file's 0600


def test_a_failed_write_is_one_error_leaves_no_temp_file_and_the_run_resumes(tmp_path, clean, monkeypatch):
    config, run_dir = job(tmp_path / "run"), RunDir(tmp_path / "run")
    run_dir.create(config)
    real_replace, writes = os.replace, []

    def disk_full_on_third_state(src, dst):
        if str(dst).endswith("state.json"):
            writes.append(dst)
            if len(writes) == 3:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", disk_full_on_third_state)
    with pytest.raises(RunStoreError, match=r"state\.json: cannot write \(No space left on device\)") as info:
        coordinator(config, run_dir).run()
    assert "\n" not in str(info.value)
    assert not [p.name for p in run_dir.path.iterdir() if p.name.startswith(".")], "no temp file left behind"
    monkeypatch.setattr(os, "replace", real_replace)
    resumed = coordinator(config, run_dir)
    resumed.resume()
    assert resumed.run() == clean[1]
    assert run_dir.read_state()["evolution"] == clean[0].read_state()["evolution"]


def test_a_torn_last_line_is_found_cut_and_rescored(tmp_path, clean):
    config, run_dir = job(tmp_path / "run"), RunDir(tmp_path / "run")
    run_dir.create(config)
    with pytest.raises(RuntimeError, match="simulated"):
        coordinator(config, run_dir, FunctionEvaluator(fail_on_call=3)).run()
    complete = run_dir.file("history.jsonl").read_bytes()
    last = complete.splitlines()[-1]
    # a kill mid-write leaves part of a line; even a whole JSON object without its newline counts as torn
    for tail in (last[: len(last) // 2], last):
        run_dir.file("history.jsonl").write_bytes(complete + tail)
        history = run_dir.load_history()
        assert history.torn_tail == tail and len(history.records) == complete.count(b"\n")
    run_dir.cut_torn_history(history)
    assert run_dir.file("history.jsonl").read_bytes() == complete
    resumed = coordinator(config, run_dir)
    resumed.resume()
    assert resumed.run() == clean[1]


def test_a_second_writer_is_refused_and_a_dead_writers_lock_is_free(tmp_path):
    run_dir = RunDir(tmp_path / "run")
    in_use = pytest.raises(RunStoreError, match="is in use by another running `longrope search`")
    with run_dir.lock(), in_use, run_dir.lock():
        pass
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom longrope.search.run_store import RunDir\n"
            f"with RunDir({str(run_dir.path)!r}).lock():\n    print('locked', flush=True)\n    time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunStoreError, match="in use"), run_dir.lock():
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with run_dir.lock():  # the kernel released the dead process's lock
        pass


def test_resume_with_history_missing_writes_nothing(tmp_path, clean):
    run_dir, _ = clean
    run_dir.file("history.jsonl").unlink()
    before = snapshot(run_dir.path)
    with pytest.raises(RunStoreError, match=r"history\.jsonl: lacks \d+ of the \d+ candidates that state\.json"):
        coordinator(job(run_dir.path), run_dir).resume()
    assert snapshot(run_dir.path) == before


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"[1, 2]", r"history\.jsonl:2: corrupted line \(a JSON list, not an object\)"),
        (b'{"mean_nll": 1.0}', r"history\.jsonl:2: corrupted line \(missing or bad \['key'"),
        (b"{oops", r"history\.jsonl:2: corrupted line \(not JSON\)"),
    ],
)
def test_a_bad_line_before_the_last_is_an_error_naming_it(clean, line, message):
    run_dir, _ = clean
    lines = run_dir.file("history.jsonl").read_bytes().splitlines(keepends=True)
    run_dir.file("history.jsonl").write_bytes(lines[0] + line + b"\n" + b"".join(lines[1:]))
    with pytest.raises(RunStoreError, match=message):
        run_dir.read_history()


def test_status_piped_into_head_ends_quietly(clean):
    run_dir, _ = clean
    longrope = os.path.join(os.path.dirname(sys.executable), "longrope")
    result = subprocess.run(
        f"'{longrope}' status --json '{run_dir.path}' | true; echo ${{PIPESTATUS[0]}}",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
    )  # `true` has long exited when status writes: the pipe is closed for sure
    assert result.stdout.strip() == "141" and result.stderr == "", result.stderr
