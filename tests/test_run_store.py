"""The run directory under faults: failed writes, a torn history line, two writers, damaged files."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys

import pytest
from cli_checks import snapshot
from search_helpers import FunctionEvaluator, make_coordinator

from longrope.search.config.job_config import JobConfig
from longrope.search.run.coordinator import Coordinator
from longrope.search.run.run_check import read_run
from longrope.search.run.run_store import RunDir, RunStoreError, write_json_atomic


def job(tmp_path, generations: int = 4) -> JobConfig:
    return JobConfig.model_validate(
        {
            "target_length": 256,
            "output_dir": str(tmp_path),
            "data": {"search_windows": 1},  # FunctionEvaluator's one window
            "search": {"generations": generations, "seed": 2},
        }
    )


def coordinator(config: JobConfig, run_dir: RunDir, evaluator=None, *, resume: bool = False) -> Coordinator:
    return make_coordinator(config, run_dir, evaluator or FunctionEvaluator(), resume=resume)


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
    resumed = coordinator(config, run_dir, resume=True)
    assert resumed.run() == clean[1]
    assert run_dir.read_state().optimizer.state == clean[0].read_state().optimizer.state


def test_a_torn_last_line_is_found_cut_and_rescored(tmp_path, clean):
    config, run_dir = job(tmp_path / "run"), RunDir(tmp_path / "run")
    run_dir.create(config)
    with pytest.raises(RuntimeError, match="simulated"):
        coordinator(config, run_dir, FunctionEvaluator(fail_on_call=3)).run()
    *kept, last = run_dir.file("history.jsonl").read_bytes().splitlines(keepends=True)
    complete = b"".join(kept)  # the last record's write was cut: it must be scored again
    # a kill mid-write leaves part of a line; even a whole JSON object without its newline counts as torn
    for tail in (last[: len(last) // 2], last.rstrip(b"\n")):
        run_dir.file("history.jsonl").write_bytes(complete + tail)
        history = run_dir.load_history()
        assert history.torn_tail == tail and len(history.records) == len(kept)
    run_dir.cut_torn_history(history)
    assert run_dir.file("history.jsonl").read_bytes() == complete
    evaluator = FunctionEvaluator()
    resumed = coordinator(config, run_dir, evaluator, resume=True)
    assert resumed.run() == clean[1]
    lines = run_dir.file("history.jsonl").read_bytes().splitlines(keepends=True)
    assert last in lines, "the torn candidate was scored again, to the same record"
    assert len(lines) == len(clean[0].read_history()) == len(kept) + evaluator.evaluated


def test_a_second_writer_is_refused_and_a_dead_writers_lock_is_free(tmp_path):
    run_dir = RunDir(tmp_path / "run")
    in_use = pytest.raises(RunStoreError, match="is in use by another running `longrope search`")
    with run_dir.lock(), in_use, run_dir.lock():
        pass
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom longrope.search.run.run_store import RunDir\n"
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


def test_a_run_with_history_missing_is_refused_and_nothing_written(tmp_path, clean):
    """What `--resume` and every command read the directory through (`read_run`) refuses it."""
    run_dir, _ = clean
    run_dir.file("history.jsonl").unlink()
    before = snapshot(run_dir.path)
    with pytest.raises(RunStoreError, match=r"history\.jsonl: holds no scored candidate, but state\.json has reached"):
        read_run(run_dir)
    assert snapshot(run_dir.path) == before


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"[1, 2]", r"history\.jsonl:2: corrupted line \(a JSON list, not an object\)"),
        (b'{"mean_nll": 1.0}', r"history\.jsonl:2: corrupted line \(key: Field required\)"),
        (
            b'{"key": "k", "generation": 0, "factors": [1.0], "n_hat": 0, "attention_factor": null, "mean_nll": "x", '
            b'"perplexity": null, "nll": [], "tokens": []}',
            r"history\.jsonl:2: corrupted line \(mean_nll: Input should be a valid number\)",
        ),
        (
            b'{"key": "k", "generation": 0, "factors": [1.0], "n_hat": 0, "attention_factor": null, "mean_nll": NaN, '
            b'"perplexity": null, "nll": [], "tokens": []}',
            r"history\.jsonl:2: corrupted line \(mean_nll: Input should be a finite number\)",
        ),
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


def test_two_exports_into_one_model_in_one_second_keep_the_original(tmp_path):
    from conftest import save_tiny_llama
    from search_helpers import JOB_RECORD

    from longrope.search.export.factors_export import factors_file_of_run, write_into_model

    config, run_dir = job(tmp_path / "run", generations=1), RunDir(tmp_path / "run")
    run_dir.create(config)
    coordinator(config, run_dir).run()
    write_json_atomic(run_dir.file("job.json"), JOB_RECORD)
    model = save_tiny_llama(tmp_path / "model", head_dim=32, max_position_embeddings=64)
    original = (model / "config.json").read_bytes()
    factors = factors_file_of_run(run_dir)
    backups = [write_into_model(factors, model), write_into_model(factors, model)]
    assert backups[0] != backups[1] and backups[0].read_bytes() == original
    assert json.loads(backups[1].read_text())["rope_parameters"]["rope_type"] == "longrope"


def test_sigterm_while_ray_starts_is_a_clean_stop(tmp_path):
    """Ray's own handler (sys.exit with the signal number) is in force during ray.init; it must still end as
    the CLI's SIGTERM stop, not as 'cannot connect to Ray'."""
    script = (
        "import os, signal, threading\n"
        "from longrope.search.cli.stops import raise_terminated\n"
        "from longrope.workers.errors import Terminated\n"
        "from longrope.workers.ray_start import ensure_ray\n"
        "from longrope.workers.specs import PoolSpec\n"
        "signal.signal(signal.SIGTERM, raise_terminated)\n"
        "threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()\n"
        "try:\n"
        "    ensure_ray(PoolSpec(local_num_cpus=1))\n"
        "    threading.Event().wait(60)\n"
        "except Terminated:\n"
        "    print('terminated')\n"
    )
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    result = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert result.stdout.strip() == "terminated", result.stderr[-2000:]


def test_a_resume_may_move_to_other_workers_only(clean):
    from longrope.search.cli.search_commands import _resume_overrides
    from longrope.search.config.strict import JobConfigError

    run_dir, _ = clean
    moved = _resume_overrides(str(run_dir.path), ["workers.num_workers=4", "workers.address=auto"])
    assert (moved.workers.num_workers, moved.workers.address) == (4, "auto")
    assert moved.hash() == run_dir.read_config().hash()
    with pytest.raises(JobConfigError, match="can change only workers"):
        _resume_overrides(str(run_dir.path), ["search.generations=99"])


def test_resume_refuses_a_run_whose_seeds_or_data_changed(clean):
    from search_helpers import JOB_RECORD

    from longrope.search.run.job_record import JobRecord, check_job_record, read_job_record

    run_dir, _ = clean
    stored = JobRecord.model_validate({**JOB_RECORD, "seeds_hash": "aaaa"})
    write_json_atomic(run_dir.file("job.json"), stored.model_dump(mode="json"))
    as_read = read_job_record(run_dir)
    assert check_job_record(run_dir, as_read, stored) is False  # unchanged: nothing to write
    for change in ({"seeds_hash": "bbbb"}, {"search_windows_hash": "other"}, {"partial_rotary_factor": 0.5}):
        name = next(iter(change))
        with pytest.raises(RunStoreError, match=rf"job\.json: {name} was .* start a new run instead"):
            check_job_record(run_dir, as_read, stored.model_copy(update=change))
    assert check_job_record(run_dir, None, stored) is True  # killed before job.json: the resume writes it


def test_a_backup_that_cannot_be_written_is_not_left_behind(tmp_path, monkeypatch):
    import shutil

    from longrope.search.export.factors_export import new_backup

    config = tmp_path / "config.json"
    config.write_text("{}")

    def disk_full(source, out):
        out.write(b"{")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(shutil, "copyfileobj", disk_full)
    with pytest.raises(OSError, match="No space left"):
        new_backup(config)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_resuming_a_finished_run_starts_no_worker(clean, capsys):
    import ray

    from longrope.search.cli.main import main

    run_dir, best = clean
    assert not ray.is_initialized()
    assert main(["search", "--no-progress", "--resume", str(run_dir.path)]) == 0
    assert json.loads(capsys.readouterr().out)["key"] == best.key
    assert not ray.is_initialized(), "nothing to score: no Ray, no model copies"


@pytest.mark.parametrize(
    ("stored", "held"),
    [
        (None, "holds a pre-release format (no format key), written before release 1.0"),
        (3, "holds pre-release format 3, written before release 1.0"),
        ("2.0", "holds format 2.0, written by a newer longrope-search"),
        ("one", "format must be one of ['1.0', '1.1'], got 'one'"),
    ],
)
def test_a_run_directory_of_another_format_is_refused_and_left_as_it_is(tmp_path, capsys, stored, held):
    """config.json's or state.json's `format` other than the one this release reads: one line naming the file, the
    format it holds and the one this release reads, exit 2, and not a byte of the directory changed."""
    from longrope.search.cli.main import main

    config = job(tmp_path, generations=1)
    run_dir = RunDir(tmp_path)
    run_dir.create(config)
    coordinator(config, run_dir).run()
    for name in ("config.json", "state.json"):
        document = json.loads(run_dir.file(name).read_text())
        document.pop("format")
        write_json_atomic(run_dir.file(name), document if stored is None else {**document, "format": stored})
        before = snapshot(tmp_path)
        for command in (
            ["status", str(tmp_path)],
            ["export", str(tmp_path), "-o", str(tmp_path / "f.json")],
            ["search", "--resume", str(tmp_path)],
        ):
            assert main(command) == 2
            error = capsys.readouterr().err.strip()
            assert error.count("\n") == 0 and error.startswith(f"longrope: error: {run_dir.file(name)}: {held}"), error
            assert "this release reads format 1.0 and 1.1" in error or "must be one of" in error
        assert snapshot(tmp_path) == before, "nothing written, not even a windows cache"
        write_json_atomic(run_dir.file(name), {**document, "format": "1.0"})
