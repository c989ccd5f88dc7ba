"""The route's wait for its queued request (``service/api/generate.py`` ``wait_for_images``):
images made as the deadline falls are answered, never turned into a 504."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from genaug.service.api.generate import wait_for_images
from genaug.service.batching.items import GroupKey, Item
from genaug.service.batching.request import QueuedRequest


class _Batcher:
    def __init__(self) -> None:
        self.forgotten: list[str] = []

    def forget(self, queued: QueuedRequest, reason: str) -> None:
        self.forgotten.append(reason)


class _Request:
    """A connected client: its next ASGI message never comes."""

    async def receive(self) -> dict[str, Any]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def test_images_made_as_the_deadline_falls_are_answered_not_504() -> None:
    """The worker completes the request in the same loop turn as the deadline: the waiter on the
    request's result has not woken yet when ``asyncio.wait`` times out. The images exist, so the
    route answers them (before: a 504 for images that were made, and a request counted lost)."""

    async def scenario() -> tuple[np.ndarray | None, list[str]]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 0.05  # the loop's clock is time.monotonic, as the request's
        queued = QueuedRequest(key=GroupKey(height=8, width=8, steps=1),
                  items=[Item("a prompt", seed=2**62 + 7, guidance=5.0, output_height=8,
                              output_width=8)],
                  client="c", priority="interactive", deadline=deadline, loop=loop)
        # The worker's delivery is due just before the deadline, and the loop is busy past
        # both (a slow turn, as on a loaded host): both callbacks run in one loop turn.
        loop.call_at(deadline - 0.01, queued.deliver, 0, [np.full((8, 8, 3), 9, np.uint8)])
        loop.call_soon(time.sleep, 0.1)
        batcher = _Batcher()
        images = await wait_for_images(queued, batcher, _Request())  # type: ignore[arg-type]
        return images, batcher.forgotten

    images, forgotten = asyncio.run(scenario())
    assert images is not None and images.shape == (1, 8, 8, 3) and int(images[0, 0, 0, 0]) == 9
    assert forgotten == []
