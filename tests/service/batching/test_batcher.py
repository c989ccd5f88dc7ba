"""Unit tests of the batcher with a stand-in worker: scheduling, admission, deadlines, failures.

No model and no HTTP: a stand-in :class:`Worker` paints every image with its item's seed, so
reassembly order is visible in the pixels, and can hold, fail or partly fail batches.
pytest-asyncio is not a dependency; each test drives its own loop with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
import pytest

from genaug.service.api.errors import status_of
from genaug.service.batching.batcher import Batcher
from genaug.service.batching.items import Flight, GroupKey, IdleWork, Item, Outcome, Paused
from genaug.service.batching.request import QueuedRequest
from genaug.service.errors import (
    DeadlineExceededError,
    GenerationFailedError,
    QueueFullError,
    ShuttingDownError,
)
from genaug.service.metrics import Metrics

KEY = GroupKey(height=8, width=8, steps=1)
OTHER_KEY = GroupKey(height=16, width=16, steps=1)
# Output size per key in these tests (a request's images share one output size).
OUTPUT = {KEY: (4, 6), OTHER_KEY: (2, 2)}


def pixel(seed: int) -> int:
    return seed % 251


class StandInWorker:
    """Paints image i with ``pixel(items[i].seed)``; records calls; can hold or fail batches.

    ``gate`` starts open; clear it to hold the worker thread at its next call (``entered`` is
    set once a call waits there). Items whose prompt is in ``raise_on`` make the whole call
    raise; those in ``fail_items`` are reported in ``Outcome.errors``.

    Each batch runs ``steps`` stand-in denoising steps and reads its flight before each, as
    the pipeline worker does: dropped rows stop (all gone: the batch ends), a pause returns
    :class:`Paused` (``steps_run`` counts every step run, to show none is run twice).
    Wrapped in :class:`~genaug.service.testing.GateWorker` it steps on command.
    """

    def __init__(self, steps: int = 1) -> None:
        self.steps = steps
        self.steps_run = 0
        self.calls: list[tuple[GroupKey, list[Item]]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.raise_on: set[str] = set()
        self.fail_items: set[str] = set()
        self.lock = threading.Lock()

    def run(
        self, key: GroupKey, items: Sequence[Item], flight: Flight | None = None
    ) -> Outcome | Paused:
        self.entered.set()
        assert self.gate.wait(timeout=10), "test forgot to open the gate"
        with self.lock:
            self.calls.append((key, list(items)))
        if any(it.prompt in self.raise_on for it in items):
            raise RuntimeError("stand-in pipeline exploded")
        return self._go(key, list(items), flight, step=0, dropped={})

    def _go(
        self, key: GroupKey, items: list[Item], flight: Flight | None, *, step: int,
        dropped: dict[int, int],
    ) -> Outcome | Paused:
        while step < self.steps:
            if flight is not None:
                gone, pause = flight.poll()
                for row in gone:
                    dropped.setdefault(row, self.steps - step)
                if len(dropped) == len(items):
                    break
                if pause:
                    resume = functools.partial(self._go, key, items, step=step, dropped=dropped)
                    return Paused(key, items, step, self.steps,
                                  resume=resume)
            step += 1
            with self.lock:
                self.steps_run += 1
        images = [np.full(item.output_shape, pixel(item.seed), np.uint8) for item in items]
        errors: dict[int, str] = {}
        for i, item in enumerate(items):
            if item.prompt in self.fail_items:
                errors[i] = f"non-finite image for seed {item.seed}"
        return Outcome(images=images, errors=errors, dropped=dropped)

    @property
    def prompts(self) -> list[str]:
        with self.lock:
            return [it.prompt for _, items in self.calls for it in items]

    def batch_prompts(self) -> list[list[str]]:
        with self.lock:
            return [[it.prompt for it in items] for _, items in self.calls]


def items(prompt: str, n: int, first_seed: int = 0, key: GroupKey = KEY) -> list[Item]:
    height, width = OUTPUT[key]
    return [
        Item(prompt, seed=first_seed + i, guidance=1.0, output_height=height, output_width=width)
        for i in range(n)
    ]


async def assert_serves_a_request(batcher: Batcher) -> None:
    """A person's one-image request is answered with its image, whatever else ran."""
    request = batcher.submit(KEY, items("request", 1, 5), client="a", priority="interactive",
                         timeout_s=10)
    assert_painted(await request.result(), [5])


def drive(
    test: Callable[[Batcher, StandInWorker], Awaitable[None]],
    *,
    worker: StandInWorker | None = None,
    idle_source: Any = None,
    max_batch_images: int = 4,
    max_wait_ms: float = 0,
    max_queue_images: int = 1000,
) -> Batcher:
    """Run ``test`` against a started batcher on a fresh loop; stop it afterwards."""
    worker = worker or StandInWorker()
    holder: dict[str, Batcher] = {}

    async def main() -> None:
        batcher = Batcher(
            worker, max_batch_images=max_batch_images, max_wait_ms=max_wait_ms,
            max_queue_images=max_queue_images, metrics=Metrics(), idle_source=idle_source,
        )
        holder["batcher"] = batcher
        await batcher.start()
        try:
            await asyncio.wait_for(test(batcher, worker), timeout=20)
        finally:
            worker.gate.set()
            await batcher.stop()

    asyncio.run(main())
    return holder["batcher"]


async def hold_worker(batcher: Batcher, worker: StandInWorker,
                      client: str = "blocker") -> QueuedRequest:
    """Put one image into the worker and keep it there until ``worker.gate.set()``."""
    worker.gate.clear()
    worker.entered.clear()
    request = batcher.submit(KEY, items("blocker", 1, 9000), client=client,
                         priority="interactive", timeout_s=30)
    assert await asyncio.to_thread(worker.entered.wait, 5), "worker never started the blocker"
    return request


def sample(batcher: Batcher, name: str, **labels: str) -> float:
    value = batcher.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def assert_painted(
    images: np.ndarray, seeds: Sequence[int], shape: tuple[int, int] = OUTPUT[KEY]
) -> None:
    assert images.dtype == np.uint8
    assert images.shape == (len(seeds), *shape, 3)
    for i, seed in enumerate(seeds):
        assert (images[i] == pixel(seed)).all(), f"image {i} is not the one for seed {seed}"


# -- splitting, closing, grouping ------------------------------------------------------------


def test_request_larger_than_a_batch_is_split_and_reassembled_in_order() -> None:
    async def test(batcher: Batcher, worker: StandInWorker) -> None:
        request = batcher.submit(KEY, items("big", 10, 100), client="a", priority="bulk",
                             timeout_s=10)
        images = await request.result()
        assert_painted(images, range(100, 110))
        assert [len(b) for b in worker.batch_prompts()] == [4, 4, 2]
        assert batcher.queued_images == 0

    drive(test, max_batch_images=4)


def test_full_batch_closes_without_waiting_for_max_wait() -> None:
    async def test(batcher: Batcher, worker: StandInWorker) -> None:
        started = time.monotonic()
        request = batcher.submit(KEY, items("full", 4), client="a", priority="interactive",
                             timeout_s=30)
        await request.result()
        # max_wait_ms is 10 s: a full batch must not sit out the wait.
        assert time.monotonic() - started < 5.0
        assert worker.batch_prompts() == [["full"] * 4]

    drive(test, max_batch_images=4, max_wait_ms=10_000)


def test_partial_batch_closes_after_max_wait() -> None:
    async def test(batcher: Batcher, worker: StandInWorker) -> None:
        started = time.monotonic()
        request = batcher.submit(KEY, items("alone", 1), client="a", priority="interactive",
                             timeout_s=30)
        await request.result()
        assert time.monotonic() - started >= 0.15  # waited for mates up to max_wait_ms
        assert len(worker.calls) == 1

    drive(test, max_batch_images=4, max_wait_ms=200)


def test_requests_arriving_within_max_wait_share_a_batch() -> None:
    async def test(batcher: Batcher, worker: StandInWorker) -> None:
        first = batcher.submit(KEY, items("one", 1), client="a", priority="interactive",
                               timeout_s=30)
        await asyncio.sleep(0.05)
        second = batcher.submit(KEY, items("two", 1, 1), client="b", priority="interactive",
                                timeout_s=30)
        await asyncio.gather(first.result(), second.result())
        assert worker.batch_prompts() == [["one", "two"]]

    drive(test, max_batch_images=4, max_wait_ms=300)


def test_batches_never_mix_group_keys() -> None:
    async def test(batcher: Batcher, worker: StandInWorker) -> None:
        blocker = await hold_worker(batcher, worker)
        requests = []
        for i, key in enumerate([KEY, OTHER_KEY, KEY, OTHER_KEY]):
            name = "main" if key == KEY else "other"
            requests.append(batcher.submit(key, items(name, 2, 10 * i, key), client=f"c{i}",
                                       priority="interactive", timeout_s=30))
        worker.gate.set()
        results = await asyncio.gather(blocker.result(), *(j.result() for j in requests))
        for key, prompts in [(k, [it.prompt for it in its]) for k, its in worker.calls[1:]]:
            expected = "main" if key == KEY else "other"
            assert set(prompts) == {expected}, (key, prompts)
        # Equal keys were grouped: the two requests of each key went in one call of 4.
        assert sorted(len(its) for _, its in worker.calls[1:]) == [4, 4]
        for request, images in zip(requests, results[1:], strict=True):
            assert images.shape[1:3] == OUTPUT[request.key]

    drive(test, max_batch_images=4)


# -- fairness --------------------------------------------------------------------------------


def test_interactive_goes_before_bulk() -> None:
    async def test(batcher: Batcher, worker: StandInWorker) -> None:
        blocker = await hold_worker(batcher, worker)
        bulk = batcher.submit(KEY, items("bulk", 4), client="trainer", priority="bulk",
                              timeout_s=30)
        interactive = batcher.submit(KEY, items("interactive", 2, 50), client="notebook",
                                     priority="interactive", timeout_s=30)
        worker.gate.set()
        await asyncio.gather(blocker.result(), bulk.result(), interactive.result())
        assert worker.batch_prompts()[1:] == [["interactive"] * 2, ["bulk"] * 2, ["bulk"] * 2]

    drive(test, max_batch_images=2)


def test_round_robin_between_clients_shares_batches() -> None:
    async def test(batcher: Batcher, worker: StandInWorker) -> None:
        blocker = await hold_worker(batcher, worker)
        flood = [batcher.submit(KEY, items("A", 8, 8 * i), client="a", priority="bulk",
                                timeout_s=30) for i in range(3)]
        single = batcher.submit(KEY, items("B", 8, 500), client="b", priority="bulk",
                                timeout_s=30)
        worker.gate.set()
        results = await asyncio.gather(*(j.result() for j in flood), single.result(),
                                       blocker.result())
        batches = worker.batch_prompts()[1:]
        assert all(len(b) == 8 for b in batches), batches
        # B's 8 images ride along in the first two batches instead of waiting behind 24 of A's.
        assert [b.count("B") for b in batches] == [4, 4, 0, 0], batches
        for i, images in enumerate(results[:3]):
            assert_painted(images, range(8 * i, 8 * i + 8))
        assert_painted(results[3], range(500, 508))

    drive(test, max_batch_images=8)


# -- admission, deadlines, cancellation ------------------------------------------------------


def test_queue_full_has_retry_after_and_admits_again_after_drain() -> None:
    async def test(batcher: Batcher, worker: StandInWorker) -> None:
        blocker = await hold_worker(batcher, worker)
        queued = batcher.submit(KEY, items("queued", 4), client="a", priority="bulk",
                                timeout_s=30)
        assert batcher.queued_images == 4
        with pytest.raises(QueueFullError) as caught:
            batcher.submit(KEY, items("one too many", 1), client="b", priority="interactive",
                           timeout_s=30)
        error = caught.value
        assert status_of(error) == 429 and error.retry_after_s is not None
        assert error.retry_after_s >= 1
        assert "max_queue_images 4" in error.message
        assert "GENAUG_MAX_QUEUE_IMAGES" in error.message
        assert sample(batcher, "genaug_rejections_total", reason="queue_full") == 1
        assert batcher.queued_images == 4  # the refused request took no slot
        worker.gate.set()
        await asyncio.gather(blocker.result(), queued.result())
        assert batcher.queued_images == 0
        again = batcher.submit(KEY, items("admitted", 4, 7), client="b",
                               priority="interactive", timeout_s=30)
        assert_painted(await again.result(), range(7, 11))
        assert "one too many" not in worker.prompts

    drive(test, max_batch_images=1, max_queue_images=4)


def test_expired_job_fails_with_deadline_exceeded_and_never_reaches_the_worker() -> None:
    async def test(batcher: Batcher, worker: StandInWorker) -> None:
        blocker = await hold_worker(batcher, worker)
        late = batcher.submit(KEY, items("late", 2), client="a", priority="interactive",
                              timeout_s=0.1)
        await asyncio.sleep(0.3)
        worker.gate.set()
        with pytest.raises(DeadlineExceededError):
            await late.result()
        await blocker.result()
        after = batcher.submit(KEY, items("after", 1), client="a", priority="interactive",
                               timeout_s=30)
        await after.result()
        assert "late" not in worker.prompts
        assert "after" in worker.prompts
        assert sample(batcher, "genaug_dropped_before_pipeline_total", reason="expired") == 1
        assert batcher.queued_images == 0

    drive(test, max_batch_images=1)


def test_forget_drops_queued_images_at_once() -> None:
    async def test(batcher: Batcher, worker: StandInWorker) -> None:
        blocker = await hold_worker(batcher, worker)
        gone = batcher.submit(KEY, items("gone", 3), client="a", priority="interactive",
                              timeout_s=30)
        kept = batcher.submit(KEY, items("kept", 2, 20), client="b", priority="interactive",
                              timeout_s=30)
        assert batcher.queued_images == 5
        batcher.forget(gone, "disconnected")
        # Freed now, while the worker is still busy, not when it next takes a batch.
        assert batcher.queued_images == 2
        assert batcher.queue.by_client() == {"b": 2}
        assert sample(batcher, "genaug_dropped_before_pipeline_total",
                      reason="disconnected") == 1
        worker.gate.set()
        await blocker.result()
        assert_painted(await kept.result(), [20, 21])
        assert "gone" not in worker.prompts
        assert batcher.queued_images == 0

    drive(test, max_batch_images=1)


def test_every_request_answered_504_counts_as_dropped_once() -> None:
    # 8 requests of one trainer pass their deadline: one while its image is in the pipeline,
    # seven queued behind it. All 8 answers are 504, so the client's dropped count is 8 (it
    # was 7: only requests pruned from the queue were counted). The caller's own timer then
    # forgets the one expired in the pipeline, as the route does: still counted once.
    async def test(batcher: Batcher, worker: StandInWorker) -> None:
        worker.gate.clear()
        worker.entered.clear()
        first = batcher.submit(KEY, items("in-flight", 1), client="trainer-a",
                               priority="interactive", timeout_s=0.2)
        assert await asyncio.to_thread(worker.entered.wait, 5)
        queued = [batcher.submit(KEY, items(f"queued-{i}", 1, 10 + i), client="trainer-a",
                                 priority="interactive", timeout_s=0.2) for i in range(7)]
        await asyncio.sleep(0.4)
        worker.gate.set()
        for request in [first, *queued]:
            with pytest.raises(DeadlineExceededError):
                await request.result()
        batcher.forget(first, "expired")  # the route's timer, after the batch's own
        assert batcher.activity.clients["trainer-a"].dropped == 8
        assert sample(batcher, "genaug_dropped_before_pipeline_total", reason="expired") == 7

    drive(test, max_batch_images=1)


def test_a_request_split_over_pipeline_and_queue_counts_as_dropped() -> None:
    # 3 images with batches of 2: two in the pipeline, one queued when the caller goes.
    async def test(batcher: Batcher, worker: StandInWorker) -> None:
        worker.gate.clear()
        worker.entered.clear()
        request = batcher.submit(KEY, items("split", 3), client="notebook", priority="interactive",
                             timeout_s=30)
        assert await asyncio.to_thread(worker.entered.wait, 5)
        assert batcher.queued_images == 1
        batcher.forget(request, "disconnected")
        worker.gate.set()
        await asyncio.sleep(0.05)
        assert batcher.activity.clients["notebook"].dropped == 1
        assert batcher.queued_images == 0

    drive(test, max_batch_images=2)


# -- failures --------------------------------------------------------------------------------


def test_worker_exception_fails_only_that_batch() -> None:
    async def test(batcher: Batcher, worker: StandInWorker) -> None:
        worker.raise_on.add("boom")
        blocker = await hold_worker(batcher, worker)
        boom = batcher.submit(KEY, items("boom", 1), client="a", priority="interactive",
                              timeout_s=30)
        mate = batcher.submit(KEY, items("mate", 1), client="b", priority="interactive",
                              timeout_s=30)
        later = batcher.submit(KEY, items("later", 2, 40), client="c", priority="bulk",
                               timeout_s=30)
        worker.gate.set()
        await blocker.result()
        errors = []
        for request in (boom, mate):
            with pytest.raises(GenerationFailedError) as caught:
                await request.result()
            errors.append(caught.value)
        assert worker.batch_prompts()[1] == ["boom", "mate"]
        error_ids = {e.error_id for e in errors}
        assert len(error_ids) == 1 and None not in error_ids
        error_id = error_ids.pop()
        assert isinstance(error_id, str) and error_id in errors[0].message
        assert isinstance(errors[0], GenerationFailedError) and status_of(errors[0]) == 503
        assert_painted(await later.result(), [40, 41])
        assert sample(batcher, "genaug_batch_failures_total", reason="RuntimeError") == 1

    drive(test, max_batch_images=2)


def test_outcome_error_fails_only_the_job_owning_the_item() -> None:
    async def test(batcher: Batcher, worker: StandInWorker) -> None:
        worker.fail_items.add("bad")
        blocker = await hold_worker(batcher, worker)
        bad = batcher.submit(KEY, items("bad", 1, 1), client="a", priority="interactive",
                             timeout_s=30)
        good = batcher.submit(KEY, items("good", 3, 30), client="b", priority="interactive",
                              timeout_s=30)
        worker.gate.set()
        await blocker.result()
        with pytest.raises(GenerationFailedError) as caught:
            await bad.result()
        assert "non-finite image for seed 1" in caught.value.message
        assert caught.value.error_id and caught.value.error_id in caught.value.message
        assert_painted(await good.result(), [30, 31, 32])
        assert sorted(worker.batch_prompts()[1]) == ["bad", "good", "good", "good"]

    drive(test, max_batch_images=4)


# -- lifecycle -------------------------------------------------------------------------------


def test_stop_fails_pending_jobs_with_shutting_down() -> None:
    worker = StandInWorker()

    async def main() -> None:
        batcher = Batcher(worker, max_batch_images=1, max_wait_ms=0, max_queue_images=100,
                          metrics=Metrics())
        await batcher.start()
        await hold_worker(batcher, worker)
        pending = [batcher.submit(KEY, items(f"p{i}", 2), client=f"c{i}",
                                  priority="bulk", timeout_s=30) for i in range(2)]
        stopping = asyncio.create_task(batcher.stop())
        for request in pending:
            with pytest.raises(ShuttingDownError):
                await asyncio.wait_for(request.result(), timeout=5)
        worker.gate.set()  # stop() waits for the batch in flight: the pipeline can't be cut
        await asyncio.wait_for(stopping, timeout=10)
        assert batcher.queued_images == 0
        assert not any(p.startswith("p") for p in worker.prompts)
        with pytest.raises(ShuttingDownError):
            batcher.submit(KEY, items("too late", 1), client="a", priority="bulk",
                           timeout_s=30)

    asyncio.run(main())


def test_stop_resolves_the_job_in_flight() -> None:
    worker = StandInWorker()

    async def main() -> None:
        batcher = Batcher(worker, max_batch_images=1, max_wait_ms=0, max_queue_images=100,
                          metrics=Metrics())
        await batcher.start()
        in_flight = await hold_worker(batcher, worker)
        stopping = asyncio.create_task(batcher.stop())
        await asyncio.sleep(0.05)
        worker.gate.set()
        await asyncio.wait_for(stopping, timeout=10)
        try:
            images = await asyncio.wait_for(in_flight.result(), timeout=2)
        except ShuttingDownError:
            return  # failing it is as good as delivering it
        assert_painted(images, [9000])

    asyncio.run(main())


# -- idle work -------------------------------------------------------------------------------


class OneIdleBatch:
    """Hands out one pre-generation batch, then has nothing to do; counts every ask."""

    def __init__(self, work: int = 1) -> None:
        self.asks = 0
        self.left = work
        self.outcomes: list[Outcome] = []
        self.done = threading.Event()
        self.lock = threading.Lock()

    def next_idle_batch(self, max_images: int) -> IdleWork | None:
        with self.lock:
            self.asks += 1
            if not self.left:
                return None
            self.left -= 1
        return IdleWork(KEY, items("pool", min(3, max_images), 70), self.on_done)

    def on_done(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        self.done.set()


def test_idle_source_runs_when_no_request_waits() -> None:
    source = OneIdleBatch(work=1)

    async def test(batcher: Batcher, worker: StandInWorker) -> None:
        assert await asyncio.to_thread(source.done.wait, 5), "idle work never ran"
        (outcome,) = source.outcomes
        assert_painted(np.stack(outcome.images), [70, 71, 72])
        assert worker.batch_prompts() == [["pool"] * 3]
        # on_done runs in the worker thread; the loop records the batch just after.
        for _ in range(100):
            if sample(batcher, "genaug_images_generated_total", source="pool"):
                break
            await asyncio.sleep(0.02)
        assert sample(batcher, "genaug_images_generated_total", source="pool") == 3
        await assert_serves_a_request(batcher)  # afterwards too

    drive(test, idle_source=source, max_batch_images=4)


def test_idle_source_with_nothing_to_do_is_not_polled_in_a_loop() -> None:
    source = OneIdleBatch(work=0)

    async def test(batcher: Batcher, worker: StandInWorker) -> None:
        await asyncio.sleep(0.3)
        assert 1 <= source.asks <= 3, f"asked the idle source {source.asks} times in 0.3 s"
        assert worker.calls == []
        await assert_serves_a_request(batcher)

    drive(test, idle_source=source, max_batch_images=4)


def test_poke_asks_an_idle_source_again() -> None:
    source = OneIdleBatch(work=0)

    async def test(batcher: Batcher, worker: StandInWorker) -> None:
        await asyncio.sleep(0.1)
        asks = source.asks
        with source.lock:
            source.left = 1  # a pool ran short
        await asyncio.sleep(0.2)
        assert source.asks == asks and not source.done.is_set()  # nobody said so yet
        batcher.poke()
        assert await asyncio.to_thread(source.done.wait, 5), "poke did not reach the source"
        assert worker.batch_prompts() == [["pool"] * 3]

    drive(test, idle_source=source, max_batch_images=4)
