"""Fixtures of the genaug.torch tests: a real service whose ``shapes`` pool fills itself.

``pool_service``: the tiny model, the ``shapes`` recipe (32x32 RGB, labels circle, square,
triangle), pre-generation on and a pool of 24 per label, so a stream finds images at once.
``real_shapes``: a small map-style dataset of real-looking images of the recipe's size, the
user's own data a :class:`~genaug.torch.MixedDataset` mixes into (``_torch_shapes.py``: a
module of its own name, so that a spawned DataLoader worker unpickling one finds it whatever
other ``conftest`` the run collected). Every test runs as on a machine without TensorFlow
(``no_tensorflow``): genaug.torch feeds through ``genaug.feeding``, never the TensorFlow
trainer.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
from _torch_shapes import RealShapes, wait_for_pool

from genaug.service.testing import LiveService


@pytest.fixture(autouse=True)
def no_tensorflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Importing TensorFlow or Keras fails in this process for the test (as where neither is
    installed); a spawned DataLoader worker imports only what a stream needs."""
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "keras", None)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def pool_service(tiny_model: Any, tmp_path_factory: pytest.TempPathFactory,
                 shapes_recipe: str) -> Iterator[LiveService]:
    from genaug.service.testing import start_service

    folder = tmp_path_factory.mktemp("torch-pool")
    (folder / "recipes.yaml").write_text(shapes_recipe)
    live = start_service(tiny_model, recipes=folder / "recipes.yaml",
                         pool_path=folder / "pool.db", pool_capacity_per_label=24,
                         max_batch_images=8, max_wait_ms=5)
    try:
        wait_for_pool(live.url, "shapes", at_least=8)
        yield live
    finally:
        live.stop()


@pytest.fixture
def real_shapes() -> RealShapes:
    return RealShapes()


@pytest.fixture(autouse=True)
def no_stream_outlives_its_test() -> Iterator[None]:
    """Streams a test started in this process stop with it (a DataLoader worker's end with
    the worker): none polls a service that a later test stopped."""
    yield
    from genaug.torch.stream import live_streams, stop_stream

    for stream in live_streams():
        stop_stream(stream.config)
