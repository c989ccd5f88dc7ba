"""Real services for the checks: uvicorn on 127.0.0.1, in a thread or in a child process.

The in-process form shares one tiny pipeline between services and lets a check wrap the real
generator (a gate that holds the worker, fault injectors); it mirrors ``start_service`` of
``tests/conftest.py``, which the runner cannot import. The child-process form
(:func:`child_service`) is the deployed shape: ``python -m genaug.service``, SIGKILL-able,
with its own RSS.

Every wait here is bounded; every start has a stop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

LOOPBACK = "127.0.0.1"


def load_tiny() -> Any:
    """The embedded tiny SDXL pipeline on the CPU (one torch thread: the machine is shared)."""
    import torch

    from genaug.service.model import load_model

    torch.set_num_threads(1)
    return load_model(source=None, unet_weights=None, device="cpu", dtype="auto")


class GateWorker:
    """Wraps the worker: records every pipeline call; clear ``gate`` to hold the next one."""

    def __init__(self, inner: Any, *, gate_timeout_s: float = 60.0) -> None:
        self.inner = inner
        self.calls: list[tuple[Any, list[Any]]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.lock = threading.Lock()
        self.gate_timeout_s = gate_timeout_s

    def run(self, key: Any, items: Sequence[Any]) -> Any:
        self.entered.set()
        self.gate.wait(timeout=self.gate_timeout_s)
        with self.lock:
            self.calls.append((key, list(items)))
        return self.inner.run(key, items)

    @property
    def prompts(self) -> list[str]:
        with self.lock:
            return [item.prompt for _, items in self.calls for item in items]


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
        except Exception:  # noqa: BLE001 - a record that cannot format is kept raw
            self.lines.append(str(record.msg))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def __enter__(self) -> LogCapture:
        for name in self.names:
            logger = logging.getLogger(name)
            self._levels[name] = logger.level
            logger.setLevel(min(self.level, logger.getEffectiveLevel()))
            logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for name in self.names:
            logger = logging.getLogger(name)
            logger.removeHandler(self)
            logger.setLevel(self._levels.get(name, logging.NOTSET))


@dataclass
class Live:
    """A running in-process service."""

    url: str
    app: Any
    worker: GateWorker | None
    server: Any
    thread: threading.Thread
    settings: Any
    extra: dict[str, Any] = field(default_factory=dict)

    def headers(self) -> dict[str, str]:
        keys = self.settings.api_keys
        return {"Authorization": f"Bearer {keys[0].get_secret_value()}"} if keys else {}

    def metric(self, name: str, labels: str = "") -> float:
        return read_metric(self.url, name, labels, headers=self.headers())

    @property
    def state(self) -> Any:
        """The app's AppState (batcher, pools), for white-box assertions."""
        return self.extra["state"]

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def read_metric(url: str, name: str, labels: str = "", *, headers: dict[str, str] | None = None,
                timeout: float = 5.0) -> float:
    """One sample from ``/metrics``; 0 when absent."""
    text = httpx.get(url + "/metrics", headers=headers or {}, timeout=timeout).text
    target = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(target + " "):
            return float(line.split()[-1])
    return 0.0


def free_port() -> int:
    from genaug.demo import free_port as _free_port

    return _free_port()


def wait_ready(url: str, timeout: float, *, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"service at {url} exited with {proc.returncode} before ready")
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"service at {url} did not become ready within {timeout} s")


def start_inprocess(
    model: Any,
    *,
    wrap: Callable[[Any], Any] | None = None,
    gate: bool = True,
    settings: Any = None,
    uvicorn_log_level: str = "warning",
    ready_timeout: float = 60,
    **settings_kwargs: Any,
) -> Live:
    """``create_app(Settings(**settings_kwargs))`` under uvicorn on a free loopback port."""
    import uvicorn

    from genaug.service.app import create_app
    from genaug.service.settings import Settings

    if settings is None:
        settings_kwargs.setdefault("port", free_port())
        settings = Settings(**settings_kwargs)
    holder: dict[str, Any] = {}

    def wrap_worker(generator: Any) -> Any:
        holder["generator"] = generator
        inner = wrap(generator) if wrap else generator
        holder["wrapped"] = inner
        if gate:
            holder["worker"] = GateWorker(inner)
            return holder["worker"]
        return inner

    app = create_app(settings, loader=lambda _s: model, wrap_worker=wrap_worker)
    config = uvicorn.Config(app, host=LOOPBACK, port=settings.port, log_level=uvicorn_log_level,
                            access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{settings.port}", daemon=True)
    thread.start()
    url = f"http://{LOOPBACK}:{settings.port}"
    try:
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            try:
                r = httpx.get(url + "/readyz", timeout=2)
                if r.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        else:
            raise RuntimeError(f"in-process service at {url} did not become ready")
    except BaseException:
        server.should_exit = True
        thread.join(timeout=30)
        raise
    live = Live(url, app, holder.get("worker"), server, thread, settings)
    live.extra.update(holder)
    # The lifespan hands its AppState to requests; the routes module keeps it on the router
    # closure only, so find it through the middleware stack's GuardMiddleware.
    live.extra["state"] = _find_state(app)
    return live


def _find_state(app: Any) -> Any:
    stack = getattr(app, "middleware_stack", None)
    seen = 0
    while stack is not None and seen < 20:
        state = getattr(stack, "state", None)
        if state is not None and hasattr(state, "batcher"):
            return state
        stack = getattr(stack, "app", None)
        seen += 1
    return None


@contextlib.contextmanager
def inprocess(model: Any, **kwargs: Any) -> Iterator[Live]:
    live = start_inprocess(model, **kwargs)
    try:
        yield live
    finally:
        live.stop()


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
    from genaug.demo import running_service

    port = port or free_port()
    with running_service(port, extra_args=list(args), env=env or child_env(),
                         log_path=log_path) as proc:
        child = Child(proc, f"http://{LOOPBACK}:{port}", port, log_path)
        wait_ready(child.url, ready_timeout, proc=proc)
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
