"""A genaug service as a child process on this machine: a free port, a started and stopped
``python -m genaug.service``.

The demo, the benchmarks, the reliability harness and the tests that need a real server in
its own process start one this way; :mod:`genaug.service.testing` picks its ports here too.
Imports nothing of genaug (``genaug[client]`` is enough to run it against an installed
service).

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
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["free_port", "running_service"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picked it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def running_service(
    port: int, *, extra_args: Sequence[str] = (), env: dict[str, str] | None = None,
    log_path: Path | None = None, entry: Sequence[str] = ("-m", "genaug.service"),
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``python -m genaug.service`` as a child process; SIGTERM and wait on exit.

    ``entry`` replaces ``-m genaug.service`` (a script that takes the same ``--port``).
    """
    cmd = [sys.executable, *entry, "--port", str(port), *extra_args]
    out = open(log_path, "wb") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env or os.environ.copy())
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if log_path:
            out.close()  # type: ignore[union-attr]
