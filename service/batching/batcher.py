"""Runs the queue on the pipeline: admission, batch timing, the worker thread, failures.

Where things run:

- On the event loop: admission (:meth:`Batcher.submit`), the fair queue
  (:class:`~genaug.service.batching.queue.FairQueue`) and the scheduling task that forms
  batches from it, and the bookkeeping in :class:`~genaug.service.batching.usage.Activity`.
- In the one **worker thread**: :meth:`Worker.run <genaug.service.batching.items.Worker.run>`, i.e.
  every pipeline call (diffusers pipelines and schedulers are not thread-safe), plus
  :meth:`run_in_worker` jobs such as the warm-up.
- In the default executor: asking the :class:`IdleSource` for the next
  pre-generation batch (it reads the pool store).
- In the one **store thread**: :attr:`IdleWork.on_done <genaug.service.batching.items.IdleWork>`,
  which stores a pre-generated batch while the worker already makes the next one.

The loop never waits on the pipeline.

Scheduling (the order itself is :mod:`~genaug.service.batching.queue`'s):

1. A batch is opened by the head of the queue and closes at ``max_batch_images`` or when its
   oldest image has waited ``max_wait_ms``. A request larger than a batch is split and
   reassembled.
2. Pool pre-generation runs only when no request waits at all, one batch at a time, so a
   request waits for at most one such batch.
3. **Admission.** Over ``max_queue_images`` waiting images a request is refused
   (:class:`~genaug.service.errors.QueueFullError`, 429 with ``Retry-After``). A request whose
   deadline passed or whose client went away is dropped before any more of its images reach
   the pipeline (:meth:`forget`).

Example::

    batcher = Batcher(worker, max_batch_images=8, max_wait_ms=10, max_queue_images=512,
                      metrics=Metrics())
    await batcher.start()
    job = batcher.submit(key, items, client="trainer-a", priority="interactive",
                         timeout_s=60)
    images = await job.result()
    await batcher.stop()
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..errors import (
    DeadlineExceededError,
    GenerationFailedError,
    QueueFullError,
    ShuttingDownError,
    new_id,
)
from ..metrics import Metrics
from .items import GroupKey, IdleSource, IdleWork, Item, Outcome, Worker
from .queue import FairQueue, Job, Part, Priority
from .usage import POOL_CLIENT, Activity

log = logging.getLogger(__name__)

SHUTTING_DOWN = "the service is shutting down; retry on a replica"

__all__ = ["POOL_CLIENT", "Batcher", "Job", "Priority"]


@dataclass
class _Batch:
    key: GroupKey
    parts: list[Part]

    @property
    def items(self) -> list[Item]:
        return [item for part in self.parts for item in part.items]


def _log_store_failure(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("storing a pre-generated batch failed", exc_info=future.exception())


class Batcher:
    """Schedule admitted requests onto one worker thread.

    Lifecycle: :meth:`start` creates the worker and store threads and the scheduling task;
    :meth:`stop` reverses it (pending requests fail with 503 ``shutting_down``).
    """

    def __init__(
        self,
        worker: Worker,
        *,
        max_batch_images: int,
        max_wait_ms: float,
        max_queue_images: int,
        metrics: Metrics,
        idle_source: IdleSource | None = None,
    ) -> None:
        self.worker = worker
        self.max_batch_images = max_batch_images
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queue_images = max_queue_images
        self.metrics = metrics
        self.idle_source = idle_source
        self.queue = FairQueue()
        self.activity = Activity(metrics)
        self.busy = False
        self._wakeup = asyncio.Event()
        self._executor: ThreadPoolExecutor | None = None
        self._store_executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="genaug-worker")
        self._store_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="genaug-store")
        self._stopping = False
        self._task = asyncio.create_task(self._schedule(), name="genaug-batcher")

    async def stop(self) -> None:
        self._stopping = True
        self._wakeup.set()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for job in self.queue.drain():
            job.fail(ShuttingDownError(SHUTTING_DOWN))
        self._update_gauges()
        loop = asyncio.get_running_loop()
        if self._executor is not None:
            # Let the batch in flight finish: the pipeline is not interruptible.
            await loop.run_in_executor(None, self._executor.shutdown, True)
            self._executor = None
        if self._store_executor is not None:
            # Pre-generated images already made are committed before the pool closes.
            await loop.run_in_executor(None, self._store_executor.shutdown, True)
            self._store_executor = None

    async def run_in_worker(self, fn: Callable[[], object]) -> object:
        """Run ``fn`` in the worker thread (warm-up and other pipeline calls outside batches)."""
        assert self._executor is not None, "start() the batcher first"
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    # -- admission -------------------------------------------------------------------------

    @property
    def queued_images(self) -> int:
        return self.queue.images

    def submit(
        self,
        key: GroupKey,
        items: list[Item],
        *,
        client: str,
        priority: Priority,
        timeout_s: float,
    ) -> Job:
        """Admit a request or raise :class:`QueueFullError`. Never blocks."""
        if self._stopping:
            raise ShuttingDownError(SHUTTING_DOWN)
        n = len(items)
        stats = self.activity.client(client)
        if self.queue.images + n > self.max_queue_images:
            self.metrics.rejections.labels("queue_full").inc()
            stats.rejected += 1
            retry = self.activity.retry_after_s(self.queue.images)
            raise QueueFullError(
                f"queue holds {self.queue.images} images; {n} more would exceed "
                f"max_queue_images {self.max_queue_images}; retry after {retry} s, ask for "
                "fewer images, or set GENAUG_MAX_QUEUE_IMAGES",
                headers={"Retry-After": str(retry)},
            )
        job = Job(
            key=key,
            items=items,
            client=client,
            priority=priority,
            deadline=time.monotonic() + timeout_s,
            loop=asyncio.get_running_loop(),
        )
        self.queue.push(job)
        stats.requests += 1
        self._update_gauges()
        self._wakeup.set()
        return job

    def poke(self) -> None:
        """Something changed for the idle source (a pool ran short): ask it again."""
        self._wakeup.set()

    def forget(self, job: Job, reason: str) -> None:
        """The caller gave up on ``job`` (deadline, disconnect): drop what is still queued."""
        job.cancel(reason)
        self._prune(time.monotonic())  # free its queue slots now, not when the worker is next free
        self._wakeup.set()

    # -- scheduling ------------------------------------------------------------------------

    def _update_gauges(self) -> None:
        self.metrics.queue_images.set(self.queue.images)
        self.metrics.queue_requests.set(self.queue.requests)

    def _prune(self, now: float) -> None:
        """Drop jobs that no longer need the pipeline, failing expired ones with 504."""
        for job in self.queue.prune(now):
            reason = job.cancel_reason or "expired"
            if job.next_index == 0:
                self.metrics.dropped.labels(reason).inc()
                self.activity.client(job.client).dropped += 1
            job.next_index = job.n
            job.fail(
                DeadlineExceededError(
                    f"request {job.id} waited past its deadline; raise timeout_s or send "
                    "fewer images at once"
                )
            )
        self._update_gauges()

    def _form(self, key: GroupKey, opened_by: tuple[Priority, str]) -> _Batch:
        now = time.monotonic()
        parts = self.queue.take(
            key, capacity=self.max_batch_images, now=now, opened_by=opened_by
        )
        for part in parts:
            if part.start == 0:
                self.metrics.queue_wait.observe(now - part.job.admitted)
        self._update_gauges()
        return _Batch(key, parts)

    async def _next_batch(self) -> _Batch | IdleWork:
        loop = asyncio.get_running_loop()
        while True:
            self._wakeup.clear()
            now = time.monotonic()
            self._prune(now)
            head = self.queue.head()
            if head is None:
                if self.idle_source is not None:
                    idle = await loop.run_in_executor(
                        None, self.idle_source.next_idle_batch, self.max_batch_images
                    )
                    if idle is not None:
                        return idle  # a request arriving now waits for this one batch
                await self._wakeup.wait()
                continue
            priority, client, job = head
            oldest, waiting = self.queue.waiting(job.key)
            close_at = oldest + self.max_wait_s
            if waiting >= self.max_batch_images or now >= close_at:
                return self._form(job.key, (priority, client))
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout=close_at - now)
            except TimeoutError:
                pass

    async def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            work = await self._next_batch()
            if isinstance(work, IdleWork):
                await self._run_idle(loop, work)
            else:
                await self._run_batch(loop, work)

    async def _run_idle(self, loop: asyncio.AbstractEventLoop, work: IdleWork) -> None:
        started = time.monotonic()
        self.busy = True
        try:
            outcome: Outcome = await loop.run_in_executor(
                self._executor, self.worker.run, work.key, work.items
            )
        except Exception as exc:
            log.exception("pre-generation batch failed (error id %s)", new_id())
            self.metrics.batch_failures.labels("exception").inc()
            if work.on_failed is not None:
                work.on_failed(exc)
            return
        finally:
            self.busy = False
        # Storing runs in its own thread, in order, while the worker makes the next batch.
        stored = loop.run_in_executor(self._store_executor, work.on_done, outcome)
        stored.add_done_callback(_log_store_failure)
        self.activity.remember(outcome)
        seconds = time.monotonic() - started
        self.activity.record(len(work.items), seconds, "pool")
        stats = self.activity.client(POOL_CLIENT)
        stats.requests += 1
        stats.images += len(work.items)
        self.activity.used(POOL_CLIENT, seconds)

    async def _run_batch(self, loop: asyncio.AbstractEventLoop, batch: _Batch) -> None:
        items = batch.items
        started = time.monotonic()
        self.busy = True
        try:
            outcome: Outcome = await loop.run_in_executor(
                self._executor, self.worker.run, batch.key, items
            )
        except asyncio.CancelledError:
            # stop() during this batch: its callers hear now, not at their deadlines.
            for part in batch.parts:
                part.job.fail(ShuttingDownError(SHUTTING_DOWN))
            raise
        except Exception as exc:
            error_id = new_id()
            log.exception(
                "batch of %d images failed (error id %s); failing its %d requests",
                len(items),
                error_id,
                len(batch.parts),
            )
            self.metrics.batch_failures.labels(type(exc).__name__).inc()
            for part in batch.parts:
                self.activity.client(part.job.client).failed += 1
                part.job.fail(
                    GenerationFailedError(
                        f"generation failed for this request's batch ({type(exc).__name__}); "
                        f"error id {error_id} is in the service log; retrying may succeed",
                        error_id=error_id,
                    )
                )
            return
        finally:
            self.busy = False
            self.queue.settle(batch.parts, time.monotonic() - started)
        seconds = time.monotonic() - started
        self.activity.record(len(items), seconds, "request")
        self.activity.remember(outcome)
        offset = 0
        for part in batch.parts:
            stats = self.activity.client(part.job.client)
            self.activity.used(part.job.client, seconds * part.count / len(items))
            failed = [i for i in range(offset, offset + part.count) if i in outcome.errors]
            if failed:
                stats.failed += 1
                error_id = new_id()
                log.error(
                    "request %s: %d images failed (error id %s): %s",
                    part.job.id,
                    len(failed),
                    error_id,
                    outcome.errors[failed[0]],
                )
                part.job.fail(
                    GenerationFailedError(
                        f"{len(failed)} of this request's images could not be generated: "
                        f"{outcome.errors[failed[0]]} (error id {error_id})",
                        error_id=error_id,
                    )
                )
            else:
                stats.images += part.count
                part.job.deliver(part.start, outcome.images[offset : offset + part.count])
            offset += part.count
