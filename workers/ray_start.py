"""Starting or joining Ray for a worker pool: an embedded Ray of our own, or a cluster at an address.

Kept apart from the pool because the driver needs it before any pool exists (a run that scores starts Ray first,
so a SIGTERM during start-up is a clean stop) and because it is where Ray's process-wide side effects are
handled: the SIGTERM handler `ray.init` installs, the guardian that stops an embedded Ray when the driver dies
(workers/ray_guardian.py), and an unreachable address that Ray itself would retry for minutes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from collections.abc import Iterator

import ray

from longrope.workers.errors import Terminated, WorkerPoolError
from longrope.workers.ray_guardian import guarded
from longrope.workers.specs import PoolSpec

CONNECT_TIMEOUT_S = 10.0


def ensure_ray(spec: PoolSpec) -> None:
    """Connect to the cluster at `spec.address`, or start a new embedded Ray when it is None.

    Embedded means a new local instance (`address="local"`): a plain `ray.init()` would join whatever cluster
    `RAY_ADDRESS` or a running `ray start` points at. A cluster address is first tried with a plain TCP
    connection bounded by CONNECT_TIMEOUT_S, because Ray itself retries an unreachable address for minutes.
    An embedded Ray runs under a guardian process that stops all of it when the driver dies, even by SIGKILL
    (workers/ray_guardian.py); a cluster we only connect to is never touched."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    quiet = {"log_to_driver": False, "logging_level": "ERROR"}
    if spec.address:
        check_reachable(spec.address)
    with kept_sigterm_handler():
        _init_ray(spec, quiet)


@contextlib.contextmanager
def kept_sigterm_handler() -> Iterator[None]:
    """`ray.init` replaces the driver's SIGTERM handler with one that calls sys.exit mid-call (a crash dump);
    keep the caller's own handler where it has one (the CLI turns SIGTERM into a clean stop; Ray still stops its
    processes at exit). Without one, Ray's handler stays, so its processes are not orphaned.

    A SIGTERM that arrives during init meets Ray's handler, whose SystemExit Ray may swallow; the handlers Ray
    installs are wrapped to record the signal (through `ray._private.utils.set_sigterm_handler`, the one place
    Ray installs them), so the stop is raised as `Terminated` once init returns."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main_thread else None
    utils = getattr(getattr(ray, "_private", None), "utils", None)
    ray_setter = getattr(utils, "set_sigterm_handler", None)
    received: list[int] = []
    if callable(previous) and callable(ray_setter):

        def recording_setter(handler):
            def recorded(signum, frame):
                received.append(signum)
                handler(signum, frame)

            ray_setter(recorded)

        utils.set_sigterm_handler = recording_setter
    try:
        yield
    finally:
        if callable(ray_setter):
            utils.set_sigterm_handler = ray_setter
        if callable(previous):
            signal.signal(signal.SIGTERM, previous)
    if received:
        raise Terminated()


def _init_ray(spec: PoolSpec, quiet: dict) -> None:
    try:
        if not spec.address:
            with guarded():  # Ray alone leaves its agents behind a killed driver (workers/ray_guardian.py)
                ray.init(
                    address="local",
                    num_cpus=spec.local_num_cpus,
                    num_gpus=spec.local_num_gpus,
                    include_dashboard=False,
                    **quiet,
                )
        elif spec.address.startswith("ray://"):
            ray.init(address=spec.address)  # Ray Client takes no local-node options
        else:
            ray.init(address=spec.address, **quiet)
    except SystemExit as exc:
        if exc.code == signal.SIGTERM:  # Ray's own handler, in force during init, exits with the signal number
            raise Terminated() from exc
        raise WorkerPoolError(f"workers.address = {spec.address!r}: cannot connect to Ray ({exc})") from exc
    except (ConnectionError, ValueError, RuntimeError) as exc:  # Ray exits when it gives up connecting
        raise WorkerPoolError(f"workers.address = {spec.address!r}: cannot connect to Ray ({exc})") from exc


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Fail within `timeout_s` when nothing answers at a `host:port` or `ray://host:port` address ("auto" and
    other forms are left to Ray, which resolves them locally)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise WorkerPoolError(
            f"workers.address = {address!r}: nothing answers there within {timeout_s:g} s ({reason}); "
            "is the Ray cluster up?"
        ) from exc
