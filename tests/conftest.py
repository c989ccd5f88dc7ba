"""Shared fixtures: one tiny model per session, real uvicorn servers on 127.0.0.1.

Servers run in a thread of the test process (:mod:`genaug.service.testing`), so tests can
share the already-built tiny pipeline and hold or count pipeline calls through
``live.worker``, a ``GateWorker``. TensorFlow never runs in this process (trainer tests use
subprocesses).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from genaug.service.testing import LiveService, load_tiny, start_service

if TYPE_CHECKING:
    from genaug.service.pipeline.load import LoadedModel

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
def tiny_model() -> LoadedModel:
    """The tiny SDXL pipeline, built once per session and shared by every test server."""
    return load_tiny()


@pytest.fixture(scope="session")
def service(tiny_model: LoadedModel) -> Iterator[LiveService]:
    """The session's shared service: tiny model, default limits, batches of up to 8."""
    live = start_service(tiny_model, max_batch_images=8, max_wait_ms=20, max_queue_images=4096)
    yield live
    live.stop()


@pytest.fixture
def make_service(tiny_model: LoadedModel) -> Iterator[Callable[..., LiveService]]:
    """Start extra services with their own settings; all stopped at the end of the test."""
    started: list[LiveService] = []

    def make(**kwargs: Any) -> LiveService:
        live = start_service(tiny_model, **kwargs)
        started.append(live)
        return live

    yield make
    for live in started:
        live.stop()
