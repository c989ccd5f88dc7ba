"""The queue in front of the pipeline: admission, grouping, fairness, deadlines.

Everything here runs on the event loop except :meth:`Worker.run`, which the batcher calls in
its one worker thread: the pipeline has exactly one caller (diffusers pipelines and
schedulers are not thread-safe), and the loop never waits on it.

Scheduling, in order:

1. **Priority.** ``interactive`` images go before ``bulk`` ones; pool pre-generation
   (:class:`IdleSource`) runs only when no request waits at all.
2. **Round-robin between clients.** Each priority level keeps one FIFO per client identity;
   a batch is filled one image per client per turn, and the client that opened a batch goes to
   the back for the next one. A trainer that floods 200 images shares every batch with a
   notebook that asks for one.
3. **Grouping.** A batch holds only images whose pipeline arguments are equal
   (:class:`GroupKey`); prompts and seeds differ freely. The batch is opened by the head of
   the queue and closes at ``max_batch_images`` or when its oldest image has waited
   ``max_wait_ms``. A request larger than a batch is split and reassembled.
4. **Admission.** Over ``max_queue_images`` waiting images a request is refused
   (:class:`QueueFullError`, 429 with ``Retry-After``). A request whose deadline passed or whose
   client went away is dropped before any more of its images reach the pipeline.

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
import math
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .errors import DeadlineExceededError, GenerationFailedError, QueueFullError, ShuttingDownError
from .metrics import Metrics
from .work import GroupKey, IdleSource, IdleWork, Item, Outcome, Worker

log = logging.getLogger(__name__)

Priority = Literal["interactive", "bulk"]
POOL_CLIENT = "(pool pre-generation)"
HISTORY_S = 600.0
RECENT_IMAGES = 16
RECENT_SIDE = 128
PRIORITIES: tuple[Priority, ...] = ("interactive", "bulk")
SHUTTING_DOWN = "the service is shutting down; retry on a replica"


@dataclass
class ClientStats:
    """What one client identity has asked of the generator (``GET /v1/clients``)."""

    requests: int = 0
    images: int = 0
    generation_s: float = 0.0
    rejected: int = 0
    dropped: int = 0
    failed: int = 0


class Job:
    """One admitted request: its images, where they stand, and the future its caller awaits."""

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
        self.id = uuid.uuid4().hex[:12]
        self.key = key
        self.items = items
        self.client = client
        self.priority = priority
        self.deadline = deadline
        self.admitted = time.monotonic()
        self.started: float | None = None
        self.next_index = 0  # first item not yet handed to the worker
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

    def _fail(self, error: BaseException) -> None:
        if not self._future.done():
            self._future.set_exception(error)
            # The exception is delivered through result(); don't warn if nobody awaits it.
            self._future.exception()

    def _deliver(self, start: int, images: list[np.ndarray]) -> None:
        if self._future.done():
            return
        if self.images is None:
            self.images = np.empty((self.n, *images[0].shape), dtype=np.uint8)
        for offset, image in enumerate(images):
            self.images[start + offset] = image
        self.done_count += len(images)
        if self.done_count == self.n:
            self._future.set_result(self.images)


def _log_store_failure(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("storing a pre-generated batch failed", exc_info=future.exception())


@dataclass
class _Part:
    job: Job
    start: int
    count: int


@dataclass
class _Batch:
    key: GroupKey
    parts: list[_Part]

    @property
    def items(self) -> list[Item]:
        return [it for p in self.parts for it in p.job.items[p.start : p.start + p.count]]


class Batcher:
    """Queue, group and schedule image requests onto one worker thread.

    Lifecycle: :meth:`start` creates the worker thread and the scheduling task;
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
        # priority -> client -> FIFO of jobs; OrderedDict order is the round-robin order.
        self._queues: dict[Priority, OrderedDict[str, deque[Job]]] = {
            p: OrderedDict() for p in PRIORITIES
        }
        self._queued_images = 0
        self._wakeup = asyncio.Event()
        self._executor: ThreadPoolExecutor | None = None
        self._store_executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._images_per_s = 0.0  # moving estimate, for Retry-After
        self.busy = False
        self.clients: dict[str, ClientStats] = {}
        # (time, images, source) per batch over the last minutes, and the latest images.
        self.history: deque[tuple[float, int, str]] = deque()
        self.recent: deque[np.ndarray] = deque(maxlen=RECENT_IMAGES)

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
        for queues in self._queues.values():
            for fifo in queues.values():
                for job in fifo:
                    job._fail(ShuttingDownError(SHUTTING_DOWN))
            queues.clear()
        self._queued_images = 0
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
        return self._queued_images

    def queued_by_client(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for queues in self._queues.values():
            for client, fifo in queues.items():
                waiting = sum(j.pending for j in fifo if j.cancel_reason is None)
                if waiting:
                    out[client] = out.get(client, 0) + waiting
        return out

    def retry_after_s(self) -> int:
        """Seconds until the queue has likely drained by a batch's worth: for Retry-After."""
        rate = self._images_per_s
        if rate <= 0:
            return 1
        return int(min(60, max(1, math.ceil(self._queued_images / rate))))

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
        stats = self.clients.setdefault(client, ClientStats())
        if self._queued_images + n > self.max_queue_images:
            self.metrics.rejections.labels("queue_full").inc()
            stats.rejected += 1
            retry = self.retry_after_s()
            raise QueueFullError(
                f"queue holds {self._queued_images} images; {n} more would exceed "
                f"max_queue_images {self.max_queue_images}; retry after {retry} s, ask for "
                "fewer images, or set GENAUG_MAX_QUEUE_IMAGES",
                headers={"Retry-After": str(retry)},
            )
        loop = asyncio.get_running_loop()
        job = Job(
            key=key,
            items=items,
            client=client,
            priority=priority,
            deadline=time.monotonic() + timeout_s,
            loop=loop,
        )
        self._queues[priority].setdefault(client, deque()).append(job)
        stats.requests += 1
        self._queued_images += n
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
        self.metrics.queue_images.set(self._queued_images)
        waiting = sum(len(fifo) for queues in self._queues.values() for fifo in queues.values())
        self.metrics.queue_requests.set(waiting)

    def _prune(self, now: float) -> None:
        """Remove jobs that no longer need the pipeline, failing expired ones with 504."""
        for queues in self._queues.values():
            for client in list(queues):
                fifo = queues[client]
                kept: deque[Job] = deque()
                for job in fifo:
                    if job.pending and job.alive(now):
                        kept.append(job)
                        continue
                    if job.pending:
                        self._queued_images -= job.pending
                        reason = job.cancel_reason or "expired"
                        if job.next_index == 0:
                            self.metrics.dropped.labels(reason).inc()
                            self.clients.setdefault(job.client, ClientStats()).dropped += 1
                        job.next_index = job.n
                        job._fail(
                            DeadlineExceededError(
                                f"request {job.id} waited past its deadline; raise timeout_s "
                                "or send fewer images at once"
                            )
                        )
                if kept:
                    queues[client] = kept
                else:
                    del queues[client]
        self._update_gauges()

    def _head(self) -> tuple[Priority, str, Job] | None:
        for priority in PRIORITIES:
            for client, fifo in self._queues[priority].items():
                if fifo:
                    return priority, client, fifo[0]
        return None

    def _oldest_admitted(self, key: GroupKey) -> tuple[float, int]:
        """(earliest admission time, images waiting) over jobs of ``key``."""
        oldest = math.inf
        count = 0
        for queues in self._queues.values():
            for fifo in queues.values():
                for job in fifo:
                    if job.key == key:
                        oldest = min(oldest, job.admitted)
                        count += job.pending
        return oldest, count

    def _form(self, key: GroupKey, head_priority: Priority, head_client: str) -> _Batch:
        """Take up to ``max_batch_images`` images of ``key``: priority first, then one image
        per client per turn."""
        capacity = self.max_batch_images
        parts: dict[str, _Part] = {}
        now = time.monotonic()
        for priority in PRIORITIES:
            queues = self._queues[priority]
            if not queues:
                continue
            while capacity:
                took = False
                for client in list(queues):
                    fifo = queues[client]
                    job = next((j for j in fifo if j.key == key and j.pending), None)
                    if job is None:
                        continue
                    part = parts.get(job.id)
                    if part is None:
                        part = parts[job.id] = _Part(job, job.next_index, 0)
                        if job.started is None:
                            job.started = now
                            self.metrics.queue_wait.observe(now - job.admitted)
                    part.count += 1
                    job.next_index += 1
                    self._queued_images -= 1
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
            if not capacity:
                break
        # The client that opened this batch waits behind the others for the next one.
        if head_client in self._queues[head_priority]:
            self._queues[head_priority].move_to_end(head_client)
        self._update_gauges()
        return _Batch(key, list(parts.values()))

    async def _next_batch(self) -> _Batch | IdleWork:
        loop = asyncio.get_running_loop()
        while True:
            self._wakeup.clear()
            now = time.monotonic()
            self._prune(now)
            head = self._head()
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
            oldest, waiting = self._oldest_admitted(job.key)
            close_at = oldest + self.max_wait_s
            if waiting >= self.max_batch_images or now >= close_at:
                return self._form(job.key, priority, client)
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
            error_id = uuid.uuid4().hex[:12]
            log.exception("pre-generation batch failed (error id %s)", error_id)
            self.metrics.batch_failures.labels("exception").inc()
            if work.on_failed is not None:
                work.on_failed(exc)
            return
        finally:
            self.busy = False
        # Storing runs in its own thread, in order, while the worker makes the next batch.
        stored = loop.run_in_executor(self._store_executor, work.on_done, outcome)
        stored.add_done_callback(_log_store_failure)
        self._remember(outcome)
        seconds = time.monotonic() - started
        self._record(len(work.items), seconds, "pool")
        stats = self.clients.setdefault(POOL_CLIENT, ClientStats())
        stats.requests += 1
        stats.images += len(work.items)
        stats.generation_s += seconds

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
                part.job._fail(ShuttingDownError(SHUTTING_DOWN))
            raise
        except Exception as exc:
            error_id = uuid.uuid4().hex[:12]
            log.exception(
                "batch of %d images failed (error id %s); failing its %d requests",
                len(items),
                error_id,
                len(batch.parts),
            )
            self.metrics.batch_failures.labels(type(exc).__name__).inc()
            for part in batch.parts:
                self.clients.setdefault(part.job.client, ClientStats()).failed += 1
                part.job._fail(
                    GenerationFailedError(
                        f"generation failed for this request's batch ({type(exc).__name__}); "
                        f"error id {error_id} is in the service log; retrying may succeed",
                        error_id=error_id,
                    )
                )
            return
        finally:
            self.busy = False
        seconds = time.monotonic() - started
        self._record(len(items), seconds, "request")
        self._remember(outcome)
        offset = 0
        for part in batch.parts:
            stats = self.clients.setdefault(part.job.client, ClientStats())
            stats.generation_s += seconds * part.count / len(items)
            failed = [i for i in range(offset, offset + part.count) if i in outcome.errors]
            if failed:
                stats.failed += 1
                error_id = uuid.uuid4().hex[:12]
                log.error(
                    "request %s: %d images failed (error id %s): %s",
                    part.job.id,
                    len(failed),
                    error_id,
                    outcome.errors[failed[0]],
                )
                part.job._fail(
                    GenerationFailedError(
                        f"{len(failed)} of this request's images could not be generated: "
                        f"{outcome.errors[failed[0]]} (error id {error_id})",
                        error_id=error_id,
                    )
                )
            else:
                stats.images += part.count
                part.job._deliver(part.start, outcome.images[offset : offset + part.count])
            offset += part.count

    def throughput(self, bucket_s: float = 10.0) -> list[dict[str, float | str]]:
        """Images per second in ``bucket_s`` buckets over the last ten minutes, by source."""
        now = time.monotonic()
        wall = time.time()
        buckets: dict[tuple[int, str], int] = {}
        for t, n, source in self.history:
            index = int((now - t) // bucket_s)
            buckets[(index, source)] = buckets.get((index, source), 0) + n
        return [
            {"ago_s": index * bucket_s, "at": wall - index * bucket_s, "source": source,
             "images_per_s": count / bucket_s}
            for (index, source), count in sorted(buckets.items())
        ]

    def _remember(self, outcome: Outcome) -> None:
        """Keep the latest servable images for the status page (never failed ones)."""
        for i in outcome.good()[-RECENT_IMAGES:]:
            image = outcome.images[i]
            step = max(1, -(-max(image.shape[:2]) // RECENT_SIDE))  # thumbnails, not 1024² PNGs
            self.recent.append(np.ascontiguousarray(image[::step, ::step]))

    def _record(self, n: int, seconds: float, source: str) -> None:
        now = time.monotonic()
        self.history.append((now, n, source))
        while self.history and self.history[0][0] < now - HISTORY_S:
            self.history.popleft()
        self.metrics.batch_images.labels(source).observe(n)
        self.metrics.images_generated.labels(source).inc(n)
        self.metrics.batch_seconds.observe(seconds)
        if seconds > 0:
            rate = n / seconds
            self._images_per_s = (
                rate if self._images_per_s == 0 else (0.8 * self._images_per_s + 0.2 * rate)
            )
