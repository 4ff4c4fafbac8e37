"""A guardian for an embedded Ray: when the driver dies, however it dies, it stops every process Ray started.

Why it is needed (Ray 2.60 on Linux, measured here): `ray.init(address="local")` starts gcs_server, the raylet,
the dashboard head, the autoscaler monitor and log_monitor as children of the driver, each with
PR_SET_PDEATHSIG=SIGKILL (`start_ray_process` in ray/_private/services.py, `fate_share`), so they die with the
driver; the workers exit when their raylet does. The raylet's own children, `ray::DashboardAgent` and
`ray::RuntimeEnvAgent`, see the raylet die at once (stdin EOF: `_check_parent_via_pipe` in
ray/_private/process_watcher.py), but before exiting they report the death to the GCS, which died too
(`report_raylet_error_logs` -> `publish_error_to_driver` in ray/_private/utils.py, with a literal 60 s timeout):
re-parented to pid 1, they outlive the driver by a minute or more. A clean stop (normal exit, exception, Ctrl-C,
SIGTERM) runs `ray.shutdown`, which stops them; SIGKILL, the OOM killer or a crash of the driver does not.

What else was weighed:
- Ray's settings: none helps. The agents are always started (`start_raylet` hands the raylet their commands),
  the 60 s is a literal, and RAY_gcs_rpc_server_reconnect_timeout_s=3 left them alive just as long (tried).
- PR_SET_PDEATHSIG on the agents: they are started by the raylet (C++), where no pre-exec hook of ours runs.
- Ray's own reaper (ray/_private/ray_process_reaper.py) kills the driver's whole process group, after making
  the driver a group leader; Ray starts it only where kernel fate-sharing is missing. A process group is the
  shell's job, which may hold other programs (`longrope search | tee log`), and a driver that leads its own
  group no longer gets the terminal's Ctrl-C.

So a guardian process, started just before `ray.init`, in a session of its own (the terminal's Ctrl-C and a
group kill do not reach it), reading a pipe whose only writer is the driver (the write end is not inherited by
what the driver starts later: Python opens it close-on-exec). It tracks processes, not a session folder, by
(pid, start time), so a reused pid is never signalled:
- while `ray.init` runs, the driver's children but those it had before (the driver names them), and their
  descendants;
- once the driver writes a byte (init returned), only those and their descendants: every process of that Ray
  instance (workers included), and never another cluster's (a `ray start` cluster is no descendant of the
  driver; a cluster we only connect to starts no process and gets no guardian).
On EOF (the driver is gone, or its init failed) it tracks once more, then sends SIGTERM to the tracked processes
still alive, then SIGKILL after a grace period. When they are all gone (`ray.shutdown`) it exits by itself. It
reads /proc, so it runs on Linux only, where Ray's fate-sharing does too; elsewhere nothing is started. It imports
nothing but the standard library, so it starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

INIT_POLL_S = 0.2  # while ray.init starts processes: find the raylet before it starts its agents
POLL_S = 1.0  # afterwards: pick up new workers, notice a ray.shutdown
GRACE_S = 2.0  # between SIGTERM and SIGKILL

Tracked = dict[int, int]  # pid -> start time (clock ticks since boot)

_guardians: list[subprocess.Popen] = []  # held for the driver's lifetime: the pipe closes when one is collected


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """Runs the body (the embedded `ray.init`) under a new guardian; tells it when the body returned. If the body
    raises, the pipe is closed at once, so the guardian stops whatever the failed init left running."""
    if not os.path.isdir("/proc"):
        yield
        return
    older = [f"{pid}:{start}" for pid, (ppid, start) in process_table().items() if ppid == os.getpid()]
    guardian = subprocess.Popen(
        [sys.executable, "-P", "-m", __name__, str(os.getpid()), *older],  # -P: no cwd on sys.path (DESIGN.md)
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield
    except BaseException:
        guardian.stdin.close()
        raise
    else:
        with contextlib.suppress(BrokenPipeError):  # a guardian that is gone has nothing to be told
            guardian.stdin.write(b"r")
            guardian.stdin.flush()
    finally:
        _guardians[:] = [g for g in _guardians if g.poll() is None] + [guardian]  # poll reaps those done


def process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, start time) of every live process, zombies left out."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := read_stat(int(entry))) is not None:
            table[int(entry)] = stat
    return table


def read_stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) from /proc/<pid>/stat (fields 4 and 22, proc(5)); None for a zombie or none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    fields = text[text.rindex(b")") + 2 :].split()  # after "pid (comm) ": comm may hold spaces and ")"
    return None if fields[0] == b"Z" else (int(fields[1]), int(fields[19]))


def track(tracked: Tracked, table: dict[int, tuple[int, int]], new_children_of: int | None, older: Tracked) -> Tracked:
    """The tracked processes still alive, the children of `new_children_of` but those in `older` (and the
    guardian), and all their descendants."""
    alive = {pid: start for pid, start in tracked.items() if table.get(pid, (0, -1))[1] == start}
    for pid, (ppid, start) in table.items():
        if ppid == new_children_of and older.get(pid) != start and pid != os.getpid():
            alive[pid] = start
    while children := {pid: s for pid, (ppid, s) in table.items() if ppid in alive and pid not in alive}:
        alive |= children
    return alive


def stop(tracked: Tracked) -> None:
    """SIGTERM to the tracked processes, SIGKILL to those alive after GRACE_S."""
    for sig, wait_s in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 0.0)):
        for pid, start in tracked.items():
            if (read_stat(pid) or (0, -1))[1] == start:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and (tracked := track(tracked, process_table(), None, {})):
            time.sleep(0.1)


def guard(driver: int, older: Tracked) -> None:
    """The guardian's loop (see the module docstring); `older` are the driver's children started before it."""
    tracked: Tracked = {}
    initialising = True
    while True:
        readable, _, _ = select.select([0], [], [], INIT_POLL_S if initialising else POLL_S)
        if readable:
            if not os.read(0, 64):
                break  # EOF: the driver is gone
            initialising = False
        tracked = track(tracked, process_table(), driver if initialising else None, older)
        if not initialising and not tracked:
            return  # Ray was shut down
    # a failed init closes the pipe at once, maybe before the first poll: its children are still the driver's now
    stop(track(tracked, process_table(), driver if initialising else None, older))


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    guard(int(sys.argv[1]), {int(pid): int(start) for pid, start in (arg.split(":") for arg in sys.argv[2:])})
