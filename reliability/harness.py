"""Real services for the checks: uvicorn on 127.0.0.1, in a thread or in a child process.

The in-process form is :func:`genaug.service.testing.start_service`: it shares one tiny
pipeline between services and lets a check wrap the real generator (a gate that holds the
worker, fault injectors). The child-process form (:func:`child_service`) is the deployed
shape: ``python -m genaug.service``, SIGKILL-able, with its own RSS. Log capture and the
/proc readers are here too.

Every wait here is bounded; every start has a stop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from genaug.service.testing import LOOPBACK, wait_ready

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


class LogCapture(logging.Handler):
    """Collects formatted records of some loggers (at ``level``) while installed."""

    def __init__(self, names: Sequence[str] = ("genaug",), level: int = logging.DEBUG) -> None:
        super().__init__(level)
        self.names = list(names)
        self.records: list[logging.LogRecord] = []
        self._levels: dict[str, int] = {}
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        try:
            self.lines.append(self.format(record))
        except Exception:  # a record that cannot format is kept raw
            self.lines.append(str(record.msg))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def __enter__(self) -> LogCapture:
        for name in self.names:
            target = logging.getLogger(name)
            self._levels[name] = target.level
            target.setLevel(min(self.level, target.getEffectiveLevel()))
            target.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for name in self.names:
            target = logging.getLogger(name)
            target.removeHandler(self)
            target.setLevel(self._levels.get(name, logging.NOTSET))


# -- child processes ------------------------------------------------------------------------


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child service: no inherited GENAUG_* settings, one torch thread
    (the machine is shared), offline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", **extra)
    return env


@dataclass
class Child:
    proc: subprocess.Popen[bytes]
    url: str
    port: int
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


@contextlib.contextmanager
def child_service(
    args: Sequence[str], *, log_path: Path, port: int | None = None, ready_timeout: float = 180,
    env: dict[str, str] | None = None,
) -> Iterator[Child]:
    """``python -m genaug.service --port P *args`` until the block ends (SIGTERM, then SIGKILL
    after 30 s); waits for ``/readyz``."""
    from genaug.local_service import free_port, running_service

    port = port or free_port()
    with running_service(port, extra_args=list(args), env=env or child_env(),
                         log_path=log_path) as proc:
        child = Child(proc, f"http://{LOOPBACK}:{port}", port, log_path)
        wait_ready(child.url, timeout=ready_timeout, alive=lambda: proc.poll() is None)
        yield child


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` from /proc (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def listen_addresses(pid: int, port: int) -> list[str]:
    """Addresses ``pid`` listens on for ``port`` (IPv4 and IPv6), from /proc/<pid>/net."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found: list[str] = []
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            parts = line.split()
            local, state = parts[1], parts[3]
            address, hexport = local.rsplit(":", 1)
            if state != "0A" or int(hexport, 16) != port or parts[9] not in inodes:  # LISTEN
                continue
            if table == "tcp":
                octets = [str(int(address[i : i + 2], 16)) for i in range(6, -1, -2)]
                found.append(".".join(octets))
            else:
                found.append("[" + address + "]")
    return found
