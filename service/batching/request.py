"""One admitted generation request as the queue holds it: :class:`QueuedRequest`, its images,
where they stand, and the future its caller awaits; and the two priorities it may have.

Made by :meth:`~genaug.service.batching.batcher.Batcher.submit`, queued by
:class:`~genaug.service.batching.queue.FairQueue`, cut into batch parts and completed part by
part (:meth:`QueuedRequest.deliver`).

Example::

    request = QueuedRequest(key=key, items=items, client="key-1a2b3c4d", priority="bulk",
                            deadline=time.monotonic() + 60, loop=asyncio.get_running_loop())
    images = await request.result()        # uint8 [n, h, w, c] once every part is made
"""

from __future__ import annotations

import asyncio
import time
from typing import Literal

import numpy as np

from ..errors import new_id
from .items import GroupKey, Item

__all__ = ["PRIORITIES", "Priority", "QueuedRequest"]

Priority = Literal["interactive", "bulk"]
PRIORITIES: tuple[Priority, ...] = ("interactive", "bulk")


class QueuedRequest:
    """One admitted request: its images, where they stand, and the future its caller awaits.

    ``next_index`` is the first item not yet handed to the worker; ``pending`` the images
    still waiting in the queue.
    """

    def __init__(
        self,
        *,
        key: GroupKey,
        items: list[Item],
        client: str,
        priority: Priority,
        deadline: float,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.id = new_id()
        self.key = key
        self.items = items
        self.client = client
        self.priority = priority
        self.deadline = deadline
        self.admitted = time.monotonic()
        self.started: float | None = None
        self.next_index = 0
        self.done_count = 0
        self.images: np.ndarray | None = None
        self.cancel_reason: str | None = None
        self._future: asyncio.Future[np.ndarray] = loop.create_future()

    @property
    def n(self) -> int:
        return len(self.items)

    @property
    def pending(self) -> int:
        """Images not yet handed to the worker."""
        return self.n - self.next_index

    @property
    def finished(self) -> bool:
        return self._future.done()

    def alive(self, now: float) -> bool:
        return self.cancel_reason is None and not self._future.done() and now < self.deadline

    def cancel(self, reason: str) -> None:
        """Give up on this request (client gone, deadline passed); queued images are dropped."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
        if not self._future.done():
            self._future.cancel()

    async def result(self) -> np.ndarray:
        """The images, ``uint8 [n, h, w, c]``, once every part has been generated."""
        return await asyncio.shield(self._future)

    def fail(self, error: BaseException) -> None:
        if not self._future.done():
            self._future.set_exception(error)
            # The exception is delivered through result(); don't warn if nobody awaits it.
            self._future.exception()

    def deliver(self, start: int, images: list[np.ndarray]) -> None:
        """Images ``start .. start+len(images)-1`` are made; complete the request with the last."""
        if self._future.done():
            return
        if self.images is None:
            self.images = np.empty((self.n, *images[0].shape), dtype=np.uint8)
        for offset, image in enumerate(images):
            self.images[start + offset] = image
        self.done_count += len(images)
        if self.done_count == self.n:
            self._future.set_result(self.images)
