"""A genaug service as a child process on this machine: a free port, a started and stopped
``python -m genaug.service``; and the two calls every child process of genaug goes through,
:func:`start_child` and :func:`stop_child`, so that none outlives its parent.

The demo, the benchmarks, the reliability harness and the tests that need a real server in
its own process start one this way; :mod:`genaug.service.testing` picks its ports here too.
Imports nothing of genaug (``genaug[client]`` is enough to run it against an installed
service).

**Children end with their parent.** A child stays in its parent's process group, so a
terminal's Ctrl-C (SIGINT to the foreground group) and Ctrl-Z reach it as they reach the
parent; the parent then stops it (:func:`stop_child`: SIGTERM, a grace period, SIGKILL). When
the parent cannot (``kill -9``, a crash), Linux ends the child anyway: :func:`start_child` asks
the kernel to SIGKILL it on the parent's death (``PR_SET_PDEATHSIG``; SIGKILL, not SIGTERM: a
service's graceful stop waits for its batch in progress, up to 15 s on a busy CPU, and nobody
waits for an orphan's). That signal follows the *thread* that started the child, so start a
long-lived child from a thread that lives as long.

Example::

    port = free_port()
    with running_service(port, extra_args=["--recipes", "recipes/digits.yaml"]) as proc:
        ...  # http://127.0.0.1:{port}; SIGTERM and wait when the block ends
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = ["INTERRUPT_GRACE_S", "free_port", "running_service", "start_child", "stop_child"]

#: Seconds a child gets to stop by itself after SIGTERM when its parent was interrupted
#: (Ctrl-C, SIGTERM) before SIGKILL: the person waits, and nothing a child of genaug holds is
#: lost by a kill (a pool's SQLite transactions are atomic; a demo's pool is temporary).
INTERRUPT_GRACE_S = 2.0

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picked it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when this process dies
    (Linux; ``None`` elsewhere). Everything it needs is prepared here, before the fork: the
    function itself only calls ``prctl`` and ``getppid``."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def start_child(cmd: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(cmd, **popen)`` for a child that must not outlive this process:
    on Linux the kernel kills it when this process dies, however it dies. Stop it
    with :func:`stop_child`."""
    return subprocess.Popen(list(cmd), preexec_fn=_die_with_parent(), **popen)


def stop_child(proc: subprocess.Popen[Any], *, grace_s: float = 30.0) -> None:
    """SIGTERM ``proc``, wait up to ``grace_s`` seconds, then SIGKILL it; reaped either way.

    An exception while waiting (a second Ctrl-C) kills it at once and propagates.
    """
    if proc.poll() is not None:
        return
    try:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def running_service(
    port: int, *, extra_args: Sequence[str] = (), env: dict[str, str] | None = None,
    log_path: Path | None = None, entry: Sequence[str] = ("-m", "genaug.service"),
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``python -m genaug.service`` as a child process (:func:`start_child`); when the
    block ends, SIGTERM and wait (30 s; :data:`INTERRUPT_GRACE_S` when it ends by an
    exception, such as Ctrl-C's ``KeyboardInterrupt``), then SIGKILL.

    ``entry`` replaces ``-m genaug.service`` (a script that takes the same ``--port``).
    """
    cmd = [sys.executable, *entry, "--port", str(port), *extra_args]
    out = open(log_path, "wb") if log_path else subprocess.DEVNULL
    proc: subprocess.Popen[bytes] = start_child(
        cmd, stdout=out, stderr=subprocess.STDOUT, env=env or os.environ.copy())
    grace_s = INTERRUPT_GRACE_S
    try:
        yield proc
        grace_s = 30.0  # a planned stop: let it finish what it is doing
    finally:
        try:
            stop_child(proc, grace_s=grace_s)
        finally:
            if log_path:
                out.close()  # type: ignore[union-attr]
