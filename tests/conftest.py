"""Shared fixtures: one tiny model per session, real uvicorn servers on 127.0.0.1.

Servers run in a thread of the test process (uvicorn.Server with its own event loop), so
tests can share the already-built tiny pipeline and wrap the real generator to record or
hold pipeline calls. TensorFlow never runs in this process (trainer tests use
subprocesses).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (gpu marker)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model() -> Any:
    """The tiny SDXL pipeline, built once per session and shared by every test server."""
    import torch

    from genaug.service.model import load_model

    torch.set_num_threads(1)
    return load_model(source=None, unet_weights=None, device="cpu", dtype="auto")


class RecordingWorker:
    """Wraps the real generator: records every pipeline call; ``gate`` can hold calls.

    ``gate`` is set (open) by default; clear it to hold the worker thread before its next
    pipeline call, which is how tests fill a queue deterministically.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[Any, list[Any]]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # set when a call starts waiting at the gate
        self.lock = threading.Lock()

    def run(self, key: Any, items: Sequence[Any]) -> Any:
        self.entered.set()
        self.gate.wait(timeout=60)
        with self.lock:
            self.calls.append((key, list(items)))
        return self.inner.run(key, items)

    @property
    def prompts(self) -> list[str]:
        with self.lock:
            return [item.prompt for _, items in self.calls for item in items]


@dataclass
class LiveService:
    url: str
    app: Any
    worker: RecordingWorker | None
    server: Any
    thread: threading.Thread
    settings: Any
    extra: dict[str, Any] = field(default_factory=dict)

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kwargs.pop("timeout", 60), **kwargs)

    def metric(self, name: str, labels: str = "") -> float:
        """Read one sample from /metrics, e.g. ``metric("genaug_dropped_before_pipeline_total",
        'reason="disconnected"')``; 0 when absent."""
        headers = {}
        keys = self.settings.api_keys
        if keys:
            headers["Authorization"] = f"Bearer {keys[0].get_secret_value()}"
        text = httpx.get(self.url + "/metrics", headers=headers).text
        target = f"{name}{{{labels}}}" if labels else name
        for line in text.splitlines():
            if line.startswith(target + " "):
                return float(line.split()[-1])
        return 0.0

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def start_service(
    model: Any,
    *,
    record: bool = True,
    wrap: Callable[[Any], Any] | None = None,
    ready_timeout: float = 60,
    **settings_kwargs: Any,
) -> LiveService:
    """Start create_app(Settings(**settings_kwargs)) under uvicorn on a free loopback port."""
    import uvicorn

    from genaug.demo import free_port
    from genaug.service.app import create_app
    from genaug.service.settings import Settings

    settings_kwargs.setdefault("port", free_port())
    settings = Settings(**settings_kwargs)
    holder: dict[str, Any] = {}

    def wrap_worker(generator: Any) -> Any:
        inner = wrap(generator) if wrap else generator
        if record:
            holder["worker"] = RecordingWorker(inner)
            return holder["worker"]
        return inner

    app = create_app(settings, loader=lambda _s: model, wrap_worker=wrap_worker)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=settings.port, log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{settings.port}", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{settings.port}"
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    else:
        server.should_exit = True
        raise RuntimeError(f"test service at {url} did not become ready")
    return LiveService(url, app, holder.get("worker"), server, thread, settings)


@pytest.fixture(scope="session")
def service(tiny_model: Any) -> Iterator[LiveService]:
    """The session's shared service: tiny model, default limits, batches of up to 8."""
    live = start_service(tiny_model, max_batch_images=8, max_wait_ms=20, max_queue_images=4096)
    yield live
    live.stop()


@pytest.fixture
def make_service(tiny_model: Any) -> Iterator[Callable[..., LiveService]]:
    """Start extra services with their own settings; all stopped at the end of the test."""
    started: list[LiveService] = []

    def make(**kwargs: Any) -> LiveService:
        live = start_service(tiny_model, **kwargs)
        started.append(live)
        return live

    yield make
    for live in started:
        live.stop()
