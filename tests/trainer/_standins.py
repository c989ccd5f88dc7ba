"""Stand-ins for the genaug client used by the trainer tests (no TensorFlow, no network).

They follow docs/contracts.md: ``sample(...)`` returns an object with ``images`` uint8
[n,h,w,3], ``labels`` int32 [n] indexing ``label_names``, ``seeds``, ``recipe``;
``generate(...)`` returns ``images``, ``seeds``, ``metadata``.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class FakeSampleResult:
    images: np.ndarray
    labels: np.ndarray
    seeds: np.ndarray
    label_names: list[str]
    recipe: str


@dataclass
class FakeGenerateResult:
    images: np.ndarray
    seeds: np.ndarray
    metadata: dict[str, Any] = field(default_factory=dict)


def class_value(label_index: int) -> int:
    """Pixel value that encodes a class in the images the fakes return."""
    return 20 * label_index + 10


class FakeAsyncClient:
    """Serves images whose pixels encode their label; can be told to fail or hang.

    ``fail_first``: the first k calls raise ``ConnectionError``; ``down`` makes every call raise
    until cleared; ``hang`` makes calls wait forever (to test cancellation on stop).
    """

    def __init__(
        self,
        label_names: list[str],
        size: tuple[int, int] = (8, 8),
        *,
        fail_first: int = 0,
        hang: bool = False,
        value_of: dict[str, int] | None = None,
    ) -> None:
        self.label_names = list(label_names)
        self.size = size
        self.fail_first = fail_first
        self.hang = hang
        self.down = False
        self.value_of = value_of or {n: class_value(i) for i, n in enumerate(self.label_names)}
        self.calls: list[dict[str, Any]] = []
        self.closed = False
        self.channels = 3
        self.detail_overrides: dict[str, Any] = {}
        self.info_calls = 0

    async def info(self) -> dict[str, Any]:
        self.info_calls += 1
        if self.hang:
            await asyncio.Event().wait()
        if self.down:
            raise ConnectionError("connection refused (fake)")
        return {"device": "cpu", "limits": {"default_size": self.size[0], "max_side": 2048}}

    async def recipe(self, name: str) -> dict[str, Any]:
        """A ``GET /v1/recipes/{name}`` answer: a full, pre-generating pool of this size."""
        if self.down:
            raise ConnectionError("connection refused (fake)")
        return {
            "name": name, "labels": list(self.label_names),
            "fill": dict.fromkeys(self.label_names, 8),
            "target_per_label": dict.fromkeys(self.label_names, 8),
            "spec": {"height": self.size[0], "width": self.size[1], "output_height": None,
                     "output_width": None, "output_channels": self.channels},
            **self.detail_overrides,
        }

    async def _gate(self) -> None:
        if self.hang:
            await asyncio.Event().wait()
        if self.down or len(self.calls) <= self.fail_first:
            raise ConnectionError("connection refused (fake)")

    async def sample(
        self, recipe: str, *, labels: list[str] | None = None, n: int = 64, wait_s: float = 0.0
    ) -> FakeSampleResult:
        self.calls.append({"op": "sample", "recipe": recipe, "labels": labels, "n": n})
        await self._gate()
        wanted = labels or self.label_names
        idx = np.array([self.label_names.index(wanted[i % len(wanted)]) for i in range(n)])
        images = np.empty([n, *self.size, 3], np.uint8)
        for i, j in enumerate(idx):
            images[i] = self.value_of[self.label_names[j]]
        return FakeSampleResult(
            images, idx.astype(np.int32), np.arange(n, dtype=np.int64), self.label_names, recipe
        )

    async def generate(self, prompt: str, *, n: int = 1, **kwargs: Any) -> FakeGenerateResult:
        self.calls.append({"op": "generate", "prompt": prompt, "n": n, **kwargs})
        await self._gate()
        h = kwargs.get("output_height") or self.size[0]
        w = kwargs.get("output_width") or self.size[1]
        value = sum(map(ord, prompt)) % 256
        images = np.full([n, h, w, 3], value, np.uint8)
        return FakeGenerateResult(images, np.arange(n, dtype=np.int64))

    async def aclose(self) -> None:
        self.closed = True


def closed_port() -> int:
    """A localhost TCP port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ClosedPortClient:
    """Every call really connects to a closed localhost port and fails (service absent)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.attempts = 0

    async def _connect(self) -> None:
        self.attempts += 1
        _, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.close()  # pragma: no cover - nothing listens there

    async def sample(self, recipe: str, **kwargs: Any) -> Any:
        await self._connect()
        raise AssertionError("unreachable")  # pragma: no cover

    async def info(self) -> Any:
        await self._connect()
        raise AssertionError("unreachable")  # pragma: no cover

    async def recipe(self, name: str) -> Any:
        await self._connect()
        raise AssertionError("unreachable")  # pragma: no cover

    async def generate(self, prompt: str, **kwargs: Any) -> Any:
        await self._connect()
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        return None
