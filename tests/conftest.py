"""Shared fixtures: one tiny model per session, real uvicorn servers on 127.0.0.1, and the
test recipe.

Servers run in a thread of the test process (:mod:`genaug.service.testing`), so tests can
share the already-built tiny pipeline and hold or count pipeline calls through
``live.worker``, a ``GateWorker``. TensorFlow never runs in this process (trainer tests use
subprocesses). ``shapes_recipe`` / ``shapes_recipes_file`` are the one test recipe of the
pool, replica and hot-path tests.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# Tests import the benchmarks (bench/ runs from the checkout, it is not installed). The root
# goes LAST on the path: first, its genaug/ folder (which has no service/ inside: the
# package-dir mapping lives in the install) would hide an installed genaug. And it goes on
# BEFORE the first `import genaug`: pytest has put tests/ on the path, where tests/genaug/
# (no __init__.py) would otherwise import as a namespace package `genaug` whenever the
# package is found only through the editable install's finder (`pytest` run as a script).
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

from genaug.service.testing import LiveService, load_tiny, start_service  # noqa: E402

if TYPE_CHECKING:
    from genaug.service.pipeline.load import LoadedModel

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SHAPES_RECIPE = """\
recipes:
  - name: shapes
    height: 32
    width: 32
    steps: 2
    guidance: 3.0
    base_seed: 7
    labels:
      circle: {prompts: ["a circle", "a round circle"]}
      square: {prompts: ["a square"]}
      triangle: {prompts: ["a triangle"], negative_prompt: "blurry"}
"""


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


@pytest.fixture(scope="session", autouse=True)
def no_pool_file_in_the_checkout() -> Iterator[None]:
    """The suite leaves no ``genaug-pool.db`` (the default GENAUG_POOL_PATH) in the
    repository root: a test that starts a service or a command with recipes gives it a pool
    path (and a cwd) under its tmp_path."""
    leftover = Path(__file__).resolve().parents[1] / "genaug-pool.db"
    before = leftover.exists()
    yield
    if not before and leftover.exists():
        pytest.fail(f"a test left {leftover}: give its service or command a pool path (or "
                    "cwd) under tmp_path")


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


@pytest.fixture(scope="session")
def shapes_recipe() -> str:
    """The YAML of the test recipe file: one recipe ``shapes``, 32x32 in 2 steps, base seed 7,
    labels circle (two prompts), square and triangle (with a negative prompt). Tests that need
    a variant edit the text (``shapes_recipe.replace("steps: 2", "steps: 0")``)."""
    return SHAPES_RECIPE


@pytest.fixture
def fill_service(make_service: Callable[..., LiveService], tmp_path: Path,
                 shapes_recipes_file: Path) -> Iterator[LiveService]:
    """A service with the ``shapes`` recipe, its pool in ``tmp_path``, no pre-generation: every
    image is one a fill asked for. Clear ``worker.gate`` to hold a fill's job live; it is
    opened again at the end."""
    service = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                           pregenerate=False, max_batch_images=8, max_wait_ms=5)
    yield service
    assert service.worker is not None
    service.worker.gate.set()


@pytest.fixture
def shapes_recipes_file(tmp_path: Path, shapes_recipe: str) -> Path:
    """``shapes_recipe`` written to ``tmp_path / "recipes.yaml"`` (for ``GENAUG_RECIPES``)."""
    path = tmp_path / "recipes.yaml"
    path.write_text(shapes_recipe)
    return path
