"""Runs the queue on the pipeline: admission, batch timing, the worker and store threads.

What a batch's end means for its callers and the books (images delivered, failures answered
with an error id, generator time charged) is :mod:`~genaug.service.batching.answers`'s request.

Where things run:

- On the event loop: admission (:meth:`Batcher.submit`), the fair queue
  (:class:`~genaug.service.batching.queue.FairQueue`) and the scheduling task that forms
  batches from it, and the bookkeeping in :class:`~genaug.service.batching.usage.Activity`.
- In the one **worker thread**: :meth:`Worker.run <genaug.service.batching.items.Worker.run>`, i.e.
  every pipeline call (diffusers pipelines and schedulers are not thread-safe), plus
  :meth:`run_in_worker` calls such as the warm-up.
- In the default executor: asking the :class:`IdleSource` for the next
  pre-generation batch (it reads the pool store).
- In the one **store thread**: :attr:`IdleWork.on_done <genaug.service.batching.items.IdleWork>`,
  which stores a pre-generated batch while the worker already makes the next one.

The loop never waits on the pipeline. It speaks to the batch in the pipeline through its
:class:`~genaug.service.batching.items.Flight`, which the worker reads between denoising steps.

Scheduling (the order itself is :mod:`~genaug.service.batching.queue`'s):

1. A batch is opened by the head of the queue and closes at ``max_batch_images`` or when its
   oldest image has waited ``max_wait_ms``. A request larger than a batch is split and
   reassembled.
2. Pool pre-generation runs only when no request waits at all, one batch at a time.
3. **People first, within one step.** A batch of bulk work (pool pre-generation, or a batch
   opened by ``bulk`` requests) *pauses* at the next denoising step boundary when an
   ``interactive`` request arrives: the worker hands back a
   :class:`~genaug.service.batching.items.Paused` batch (latents, its own scheduler state,
   its generators), the interactive batches run, and the paused batch resumes where it
   stopped (a paused pool batch before any other bulk work starts). Pausing rather than
   stopping and planning again keeps every step already run, keeps a pool batch's
   reservation (so no plan index, hence no seed, is repeated or skipped) and gives
   bit-identical images.
   **Time slices.** Within one priority, a request batch pauses once the group that opened
   it has been served ``slice_ms`` more than a group that waits; the next batch is the
   least-served group's (the policy: :mod:`~genaug.service.batching.slices`). At most
   :data:`MAX_PAUSED` batches are paused at once; at that bound the batch in the pipeline
   runs on. Generator time is measured per segment and charged to the fair queue and to each
   client's usage then.
4. **Stop work nobody waits for.** A request whose client went away or whose deadline passed
   (:meth:`forget`, or the batch's own deadline timer: 504 at the deadline, during generation
   too) is dropped from the queue, and its rows in the batch in flight (or paused) are cut at
   the next step boundary; a batch with no row left stops. Counted in
   ``genaug_steps_saved_total`` and ``genaug_dropped_in_pipeline_total``.
5. **Admission.** Over ``max_queue_images`` waiting images a request is refused
   (:class:`~genaug.service.errors.QueueFullError`, 429 with ``Retry-After``).

Example::

    batcher = Batcher(worker, max_batch_images=8, max_wait_ms=10, max_queue_images=512,
                      metrics=Metrics(), slice_ms=1000)
    await batcher.start()
    request = batcher.submit(key, items, client="trainer-a", priority="interactive",
                         timeout_s=60)
    images = await request.result()
    await batcher.stop()
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..errors import DeadlineExceededError, QueueFullError, ShuttingDownError
from ..metrics import Metrics
from .answers import SHUTTING_DOWN, answer, answer_failure, charge
from .items import Flight, GroupKey, IdleSource, Item, Outcome, Paused, Worker
from .queue import Batch, FairQueue, group_of
from .request import Priority, QueuedRequest
from .slices import pick, yield_at
from .usage import POOL_CLIENT, Activity

log = logging.getLogger(__name__)

#: Most batches paused at once. Each keeps its latents, scheduler history and text
#: embeddings on the device (an SDXL 1024x1024 batch of 8: about 10 MB), so the bound is
#: about the count of clients switched between, not memory.
MAX_PAUSED = 8

__all__ = ["POOL_CLIENT", "Batcher"]


def _log_store_failure(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("storing a pre-generated batch failed", exc_info=future.exception())


class Batcher:
    """Schedule admitted requests onto one worker thread.

    Lifecycle: :meth:`start` creates the worker and store threads and the scheduling task;
    :meth:`stop` reverses it: pending requests fail with 503 ``shutting_down`` at once, a
    request batch in flight stops at its next step, pool work in flight (or paused) is
    finished and stored.

    ``slice_ms`` is the time slice (``GENAUG_SLICE_MS``); ``clock`` times segments and
    slices (``time.monotonic``; tests pass a clock they move by hand).
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
        slice_ms: float = 1000.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.worker = worker
        self.max_batch_images = max_batch_images
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queue_images = max_queue_images
        self.metrics = metrics
        self.idle_source = idle_source
        self.slice_s = slice_ms / 1000.0
        self.clock = clock
        self.queue = FairQueue(slice_s=self.slice_s)
        self.activity = Activity(metrics)
        self.busy = False
        self._running: Batch | None = None  # in the pipeline now
        self._paused: list[Batch] = []  # stopped at a step boundary, oldest first
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
        for request in self.queue.drain():
            request.fail(ShuttingDownError(SHUTTING_DOWN))
        self._update_gauges()
        for batch in (self._running, *self._paused):
            if batch is None:
                continue
            batch.flight.go_on()
            if batch.idle is None:  # its callers hear now; the worker stops at the next step
                for part in batch.parts:
                    part.request.fail(ShuttingDownError(SHUTTING_DOWN))
                batch.flight.drop(range(len(batch.items)))
        self._wakeup.set()
        if self._task is not None:
            try:
                await self._task
            except Exception:  # a scheduling bug must not keep the service from stopping
                log.exception("the scheduling task failed")
            finally:
                self._task = None
        while self._paused and self._executor is not None:
            # Pool work paused at a step boundary is finished and stored: no plan gap.
            # (Request batches paused have every row dropped: they end at once.)
            await self._run(self._paused.pop(0))
        loop = asyncio.get_running_loop()
        if self._executor is not None:
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

    @property
    def paused_batches(self) -> int:
        """Batches paused at a step boundary now, waiting to resume."""
        return len(self._paused)

    def submit(
        self,
        key: GroupKey,
        items: list[Item],
        *,
        client: str,
        priority: Priority,
        timeout_s: float,
    ) -> QueuedRequest:
        """Admit a request or raise :class:`QueueFullError`. Never blocks.

        An interactive request pauses the bulk batch in the pipeline at its next step; a
        request of a group served less than the batch's pauses it once its slice is used."""
        if self._stopping:
            raise ShuttingDownError(SHUTTING_DOWN)
        n = len(items)
        stats = self.activity.seen(client)
        if self.queue.images + n > self.max_queue_images:
            self.metrics.rejections.labels("queue_full").inc()
            stats.rejected += 1
            retry = self.activity.retry_after_s(self.queue.images)
            raise QueueFullError(
                f"queue holds {self.queue.images} images; {n} more would exceed "
                f"max_queue_images {self.max_queue_images}; retry after {retry} s, ask for "
                "fewer images, or set GENAUG_MAX_QUEUE_IMAGES",
                retry_after_s=retry,
            )
        request = QueuedRequest(
            key=key,
            items=items,
            client=client,
            priority=priority,
            deadline=time.monotonic() + timeout_s,
            loop=asyncio.get_running_loop(),
        )
        self.queue.push(request)
        stats.requests += 1
        self._update_gauges()
        self._wakeup.set()
        return request

    def poke(self) -> None:
        """Something changed for the idle source (a pool ran short): ask it again."""
        self._wakeup.set()

    def forget(self, request: QueuedRequest, reason: str) -> None:
        """The caller gave up on ``request`` (deadline, disconnect): drop what is still queued,
        and cut its images from the batch in the pipeline (or paused) at the next step."""
        self._given_up(request)
        request.cancel(reason)
        self._cut(request)
        self._prune(time.monotonic())  # free its queue slots now, not when the worker is next free
        self._wakeup.set()

    def _expire(self, request: QueuedRequest) -> None:
        """``request``'s deadline passed while its images were in the pipeline: 504 now."""
        if request.finished:
            return
        self._given_up(request)
        request.fail(
            DeadlineExceededError(
                f"request {request.id} passed its deadline during generation; raise timeout_s or "
                "send fewer images at once"
            )
        )
        self.forget(request, "expired")

    def _given_up(self, request: QueuedRequest) -> None:
        """Count ``request`` as dropped for its client, once: called just before every path that
        answers it 504 or 499 (queue pruned, deadline in the pipeline, caller gone), and only
        the first, still unanswered, counts. Wherever its images were: counting only those
        pruned from the queue missed the request in the pipeline (7 dropped for 8 answers
        of 504)."""
        if not request.finished:
            self.activity.client(request.client).dropped += 1

    def _cut(self, request: QueuedRequest) -> None:
        for batch in (self._running, *self._paused):
            if batch is not None and batch.idle is None:
                rows = batch.rows_of(request)
                if rows:
                    batch.flight.drop(rows)

    # -- scheduling ------------------------------------------------------------------------

    def _update_gauges(self) -> None:
        """The queue changed: gauges, and when the batch in the pipeline should yield."""
        self.metrics.queue_images.set(self.queue.images)
        self.metrics.queue_requests.set(self.queue.requests)
        self.metrics.paused_batches.set(len(self._paused))
        if self._running is not None:
            self._running.flight.pause_at(self._yield_at(self._running))

    def _yield_at(self, batch: Batch) -> float | None:
        """When ``batch`` (in the pipeline) should pause (:func:`~.slices.yield_at`);
        ``None``: never, also while stopping or at :data:`MAX_PAUSED` paused batches."""
        if self._stopping or len(self._paused) >= MAX_PAUSED:
            return None
        return yield_at(batch, self.queue, self._paused, slice_s=self.slice_s)

    def _prune(self, now: float) -> None:
        """Drop requests that no longer need the pipeline, failing expired ones with 504."""
        for request in self.queue.prune(now):
            reason = request.cancel_reason or "expired"
            if request.next_index == 0:
                self.metrics.dropped.labels(reason).inc()
            self._given_up(request)
            request.next_index = request.n
            request.fail(
                DeadlineExceededError(
                    f"request {request.id} waited past its deadline; raise timeout_s or send "
                    "fewer images at once"
                )
            )
            self._cut(request)
        self._update_gauges()

    def _form(self, key: GroupKey, opened_by: tuple[Priority, str]) -> Batch:
        now = time.monotonic()
        parts = self.queue.take(
            key, capacity=self.max_batch_images, now=now, opened_by=opened_by
        )
        for part in parts:
            if part.start == 0:
                self.metrics.queue_wait.observe(now - part.request.admitted)
        self.queue.hold(parts)
        self._update_gauges()
        return Batch(key, parts, priority=opened_by[0], opener=group_of(opened_by[1]),
                     flight=Flight(self.clock))

    async def _next_batch(self) -> Batch | None:
        """The next batch to run (a paused one to resume, a new one), or ``None`` to stop."""
        loop = asyncio.get_running_loop()
        while not self._stopping:
            self._wakeup.clear()
            now = time.monotonic()
            self._prune(now)
            head = pick(self._paused, self.queue)
            if isinstance(head, Batch):
                self._paused.remove(head)
                self._update_gauges()
                return head
            if head is None:
                if self.idle_source is not None:
                    idle = await loop.run_in_executor(
                        None, self.idle_source.next_idle_batch, self.max_batch_images
                    )
                    if idle is not None:  # (run even if stopping now: it holds a reservation)
                        return Batch(idle.key, [], idle=idle, opener=POOL_CLIENT,
                                     flight=Flight(self.clock))
                await self._wakeup.wait()
                continue
            priority, client, request = head
            oldest, waiting = self.queue.waiting(request.key)
            close_at = oldest + self.max_wait_s
            if waiting >= self.max_batch_images or now >= close_at:
                return self._form(request.key, (priority, client))
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout=close_at - now)
            except TimeoutError:
                pass
        return None

    async def _schedule(self) -> None:
        while not self._stopping:
            batch = await self._next_batch()
            if batch is None:
                return
            await self._run(batch)

    async def _run(self, batch: Batch) -> None:
        """Run (or resume) ``batch`` until it ends or pauses for other work."""
        loop = asyncio.get_running_loop()
        flight = batch.flight
        if batch.idle is None and not batch.timers:
            now = time.monotonic()
            for request in {id(p.request): p.request for p in batch.parts}.values():
                batch.timers.append(
                    loop.call_later(max(0.0, request.deadline - now), self._expire, request)
                )
        if batch.paused is not None:
            call = functools.partial(batch.paused.resume, flight)
        else:
            call = functools.partial(self.worker.run, batch.key, batch.items, flight)
        batch.paused = None
        self._running = batch
        self.busy = True
        batch.segment_start = self.clock()
        flight.pause_at(self._yield_at(batch))  # (work may have arrived while it was formed)
        try:
            result = await loop.run_in_executor(self._executor, call)
        except asyncio.CancelledError:
            # The loop is going away during this batch: its callers hear now.
            for part in batch.parts:
                part.request.fail(ShuttingDownError(SHUTTING_DOWN))
            raise
        except Exception as exc:
            self._segment_ended(batch)
            answer_failure(batch, exc, queue=self.queue, activity=self.activity,
                           metrics=self.metrics)
            return
        finally:
            self.busy = False
            self._running = None
        self._segment_ended(batch)
        if isinstance(result, Paused):
            batch.paused = result
            self._paused.append(batch)
            self.metrics.preemptions.inc()
            self._update_gauges()
            return
        self._done(batch, result)

    def _segment_ended(self, batch: Batch) -> None:
        charge(batch, max(0.0, self.clock() - batch.segment_start), queue=self.queue,
               activity=self.activity)

    def _done(self, batch: Batch, outcome: Outcome) -> None:
        answer(batch, outcome, queue=self.queue, activity=self.activity, metrics=self.metrics)
        if batch.idle is not None:
            # Storing runs in its own thread, in order, while the worker makes the next batch.
            loop = asyncio.get_running_loop()
            stored = loop.run_in_executor(self._store_executor, batch.idle.on_done, outcome)
            stored.add_done_callback(_log_store_failure)
