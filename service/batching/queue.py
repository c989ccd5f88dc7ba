"""The fair queue: admitted requests waiting for the pipeline, and how a batch is taken.

A synchronous data structure with no I/O, no threads and no clock of its own (callers pass
``now``), so it is unit-tested directly (``tests/service/batching/test_queue.py``). The
:class:`~genaug.service.batching.batcher.Batcher` owns one and drives it from the event loop.

Order of service:

1. **Priority.** ``interactive`` images go before ``bulk`` ones.
2. **Round-robin between clients.** Each priority keeps one FIFO of jobs per client identity;
   a batch is filled one image per client per turn, and the client that opened a batch goes
   to the back for the next one. A trainer that floods 200 images shares every batch with a
   notebook that asks for one.
3. **Grouping.** A batch holds only images of one :class:`~genaug.service.batching.items.GroupKey`;
   jobs of other keys keep their place.

Example::

    queue = FairQueue()
    queue.push(job)                        # a Job made by Batcher.submit
    priority, client, head = queue.head()
    parts = queue.take(head.key, capacity=8, now=time.monotonic(),
                       opened_by=(priority, client))
    queue.images                           # images still waiting
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..errors import new_id
from .items import GroupKey, Item

Priority = Literal["interactive", "bulk"]
PRIORITIES: tuple[Priority, ...] = ("interactive", "bulk")


class Job:
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
        """Give up on this job (client gone, deadline passed); queued images are dropped."""
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
        """Images ``start .. start+len(images)-1`` are made; complete the job with the last."""
        if self._future.done():
            return
        if self.images is None:
            self.images = np.empty((self.n, *images[0].shape), dtype=np.uint8)
        for offset, image in enumerate(images):
            self.images[start + offset] = image
        self.done_count += len(images)
        if self.done_count == self.n:
            self._future.set_result(self.images)


@dataclass
class Part:
    """``count`` consecutive images of ``job``, from item ``start``, inside one batch."""

    job: Job
    start: int
    count: int

    @property
    def items(self) -> list[Item]:
        return self.job.items[self.start : self.start + self.count]


class FairQueue:
    """Jobs by priority, then by client FIFO; OrderedDict order is the round-robin order."""

    def __init__(self) -> None:
        self._queues: dict[Priority, OrderedDict[str, deque[Job]]] = {
            p: OrderedDict() for p in PRIORITIES
        }
        self.images = 0  # images waiting, over all jobs

    # -- adding and removing -------------------------------------------------------------

    def push(self, job: Job) -> None:
        self._queues[job.priority].setdefault(job.client, deque()).append(job)
        self.images += job.pending

    def jobs(self) -> Iterator[Job]:
        for queues in self._queues.values():
            for fifo in queues.values():
                yield from fifo

    @property
    def requests(self) -> int:
        """Jobs with images waiting."""
        return sum(len(fifo) for queues in self._queues.values() for fifo in queues.values())

    def by_client(self) -> dict[str, int]:
        """Images waiting per client identity (cancelled jobs not counted)."""
        out: dict[str, int] = {}
        for job in self.jobs():
            if job.pending and job.cancel_reason is None:
                out[job.client] = out.get(job.client, 0) + job.pending
        return out

    def prune(self, now: float) -> list[Job]:
        """Remove jobs that no longer need the pipeline (cancelled, expired); return those
        that still had images waiting, with their ``pending`` images given up."""
        removed: list[Job] = []
        for queues in self._queues.values():
            for client in list(queues):
                kept: deque[Job] = deque()
                for job in queues[client]:
                    if job.pending and job.alive(now):
                        kept.append(job)
                    elif job.pending:
                        self.images -= job.pending
                        removed.append(job)
                if kept:
                    queues[client] = kept
                else:
                    del queues[client]
        return removed

    def drain(self) -> list[Job]:
        """Remove and return every job (shutdown)."""
        jobs = list(self.jobs())
        for queues in self._queues.values():
            queues.clear()
        self.images = 0
        return jobs

    # -- choosing the next batch ---------------------------------------------------------

    def head(self) -> tuple[Priority, str, Job] | None:
        """The job that opens the next batch: first client of the highest priority."""
        for priority in PRIORITIES:
            for client, fifo in self._queues[priority].items():
                if fifo:
                    return priority, client, fifo[0]
        return None

    def waiting(self, key: GroupKey) -> tuple[float, int]:
        """(earliest admission time, images waiting) over the jobs of ``key``."""
        oldest = math.inf
        count = 0
        for job in self.jobs():
            if job.key == key:
                oldest = min(oldest, job.admitted)
                count += job.pending
        return oldest, count

    def take(
        self, key: GroupKey, *, capacity: int, now: float, opened_by: tuple[Priority, str]
    ) -> list[Part]:
        """Take up to ``capacity`` images of ``key``: priority first, then one image per
        client per turn. The client that opened the batch goes to the back of its priority.

        Jobs handed their first image get ``started = now``.
        """
        parts: dict[str, Part] = {}
        for priority in PRIORITIES:
            queues = self._queues[priority]
            while capacity and queues:
                took = False
                for client in list(queues):
                    fifo = queues[client]
                    job = next((j for j in fifo if j.key == key and j.pending), None)
                    if job is None:
                        continue
                    part = parts.get(job.id)
                    if part is None:
                        part = parts[job.id] = Part(job, job.next_index, 0)
                        if job.started is None:
                            job.started = now
                    part.count += 1
                    job.next_index += 1
                    self.images -= 1
                    capacity -= 1
                    took = True
                    if not job.pending:
                        fifo.remove(job)
                        if not fifo:
                            del queues[client]
                    if not capacity:
                        break
                if not took:
                    break
        head_priority, head_client = opened_by
        if head_client in self._queues[head_priority]:
            self._queues[head_priority].move_to_end(head_client)
        return list(parts.values())
