"""The batcher's word to a batch in flight, stepped on command: people first within one step,
work nobody waits for cut between steps, deadlines during generation.

A stand-in worker (``test_batcher.StandInWorker``, ``steps`` per batch, reading its flight
before each) wrapped in the service's :class:`~genaug.service.testing.GateWorker` with
``stepping`` on: the test decides when each step boundary is passed, so every interleaving
below is forced, not hoped for. The same behaviour on the real pipeline is tested in
``tests/service/pipeline/test_worker_steps.py`` and through HTTP in
``tests/service/api/test_preemption_api.py``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

import pytest
from test_batcher import KEY, OTHER_KEY, StandInWorker, assert_painted, items, pixel, sample

from genaug.service.batching.batcher import Batcher
from genaug.service.batching.items import IdleWork, Outcome
from genaug.service.errors import DeadlineExceededError
from genaug.service.metrics import Metrics
from genaug.service.testing import GateWorker


def run(
    test: Callable[[Batcher, GateWorker, StandInWorker], Awaitable[None]],
    *,
    steps: int = 6,
    idle_source: object = None,
    max_batch_images: int = 4,
) -> None:
    """Run ``test`` against a started batcher whose stand-in worker steps on command."""
    inner = StandInWorker(steps=steps)
    worker = GateWorker(inner, gate_timeout_s=20)
    worker.stepping = True

    async def main() -> None:
        batcher = Batcher(
            worker, max_batch_images=max_batch_images, max_wait_ms=0, max_queue_images=1000,
            metrics=Metrics(), idle_source=idle_source,
        )
        await batcher.start()
        try:
            await asyncio.wait_for(test(batcher, worker, inner), timeout=30)
        finally:
            worker.stop_stepping()
            await batcher.stop()

    asyncio.run(main())


async def hold(worker: GateWorker, count: int) -> None:
    """Let the worker run to its ``count``-th step boundary (over all batches) and hold it."""
    worker.hold_at(count)
    await asyncio.to_thread(worker.wait_boundary, count)


# -- people first ----------------------------------------------------------------------------


def test_interactive_arrival_pauses_a_bulk_batch_at_the_next_step_and_it_resumes() -> None:
    async def test(batcher: Batcher, worker: GateWorker, inner: StandInWorker) -> None:
        bulk = batcher.submit(KEY, items("bulk", 4, 100), client="trainer", priority="bulk",
                              timeout_s=30)
        await hold(worker, 3)  # two steps run, held before the third
        person = batcher.submit(KEY, items("person", 1, 7), client="notebook",
                                priority="interactive", timeout_s=30)
        worker.stop_stepping()
        assert_painted(await person.result(), [7])
        assert_painted(await bulk.result(), range(100, 104))
        assert worker.events == ["run bulk x4", "paused at 2", "run person x1",
                                 "resume bulk x4"]
        assert inner.steps_run == 6 + 6  # the bulk batch's six steps, none run twice
        assert sample(batcher, "genaug_preemptions_total") == 1

    run(test)


def test_interactive_work_never_pauses_for_interactive_arrivals() -> None:
    async def test(batcher: Batcher, worker: GateWorker, inner: StandInWorker) -> None:
        first = batcher.submit(KEY, items("first", 4, 100), client="a",
                               priority="interactive", timeout_s=30)
        await hold(worker, 2)
        second = batcher.submit(KEY, items("second", 1, 7), client="b",
                                priority="interactive", timeout_s=30)
        worker.stop_stepping()
        await asyncio.gather(first.result(), second.result())
        assert worker.events == ["run first x4", "run second x1"]
        assert sample(batcher, "genaug_preemptions_total") == 0

    run(test)


def test_a_paused_bulk_batch_resumes_before_other_bulk_work_and_pauses_again() -> None:
    async def test(batcher: Batcher, worker: GateWorker, inner: StandInWorker) -> None:
        bulk = batcher.submit(KEY, items("bulk", 4, 100), client="t", priority="bulk",
                              timeout_s=30)
        await hold(worker, 2)
        # (another key: bulk images of the same key would ride in the interactive batch)
        later_bulk = batcher.submit(OTHER_KEY, items("later", 1, 50, OTHER_KEY), client="u",
                                    priority="bulk", timeout_s=30)
        one = batcher.submit(KEY, items("one", 1, 1), client="n", priority="interactive",
                             timeout_s=30)
        await hold(worker, 3)  # the bulk batch paused at step 1; "one" held at its first step
        await hold(worker, 3 + 6)  # "one" ran (boundaries 3-8); the bulk batch resumed
        assert_painted(await one.result(), [1])
        two = batcher.submit(KEY, items("two", 1, 2), client="n", priority="interactive",
                             timeout_s=30)
        worker.stop_stepping()
        await asyncio.gather(bulk.result(), later_bulk.result(), two.result())
        assert worker.events == [
            "run bulk x4", "paused at 1", "run one x1", "resume bulk x4", "paused at 1",
            "run two x1", "resume bulk x4", "run later x1",
        ]
        assert sample(batcher, "genaug_preemptions_total") == 2

    run(test)


class Plan:
    """An idle source like the pool planner: batch b holds plan indices 4b .. 4b+3 (seeds =
    indices); ``stored`` gets every stored index, in order."""

    def __init__(self, batches: int) -> None:
        self.left = batches
        self.next = 0
        self.stored: list[int] = []
        self.done = threading.Event()

    def next_idle_batch(self, max_images: int) -> IdleWork | None:
        if not self.left:
            return None
        self.left -= 1
        first, self.next = self.next, self.next + 4
        return IdleWork(KEY, items("pool", 4, first), self.on_done)

    def on_done(self, outcome: Outcome) -> None:
        for image in outcome.images:
            self.stored.append(int(image.flat[0]))
        if not self.left:
            self.done.set()


def test_pool_work_pauses_for_people_and_no_plan_index_is_repeated_or_skipped() -> None:
    plan = Plan(batches=2)

    async def test(batcher: Batcher, worker: GateWorker, inner: StandInWorker) -> None:
        await hold(worker, 2)  # the first pool batch, held before its step 1
        person = batcher.submit(KEY, items("person", 1, 200), client="n",
                                priority="interactive", timeout_s=30)
        worker.stop_stepping()
        assert_painted(await person.result(), [200])
        assert await asyncio.to_thread(plan.done.wait, 10)
        for _ in range(100):  # on_done ran in the store thread; wait for the second store
            if len(plan.stored) == 8:
                break
            await asyncio.sleep(0.02)
        assert plan.stored == [pixel(i) for i in range(8)]
        assert worker.events[:4] == ["run pool x4", "paused at 1", "run person x1",
                                     "resume pool x4"]

    run(test, idle_source=plan)


def test_stop_finishes_and_stores_a_paused_pool_batch() -> None:
    plan = Plan(batches=1)

    async def test(batcher: Batcher, worker: GateWorker, inner: StandInWorker) -> None:
        await hold(worker, 2)
        worker.entered.clear()
        worker.gate.clear()  # the interactive batch will wait at the gate
        batcher.submit(KEY, items("person", 1, 200), client="n", priority="interactive",
                       timeout_s=30)
        worker.step(1)  # pool pauses at step 1
        await asyncio.to_thread(worker.entered.wait, 5)
        worker.stop_stepping()
        stopping = asyncio.create_task(batcher.stop())
        await asyncio.sleep(0.05)
        worker.gate.set()
        await asyncio.wait_for(stopping, 10)
        assert plan.stored == [pixel(i) for i in range(4)]  # finished, stored at stop

    run(test, idle_source=plan)


# -- work nobody waits for ----------------------------------------------------------------


def test_a_disconnected_request_is_cut_at_the_next_step_and_its_mates_finish() -> None:
    async def test(batcher: Batcher, worker: GateWorker, inner: StandInWorker) -> None:
        gone = batcher.submit(KEY, items("gone", 2, 10), client="a", priority="interactive",
                              timeout_s=30)
        stays = batcher.submit(KEY, items("stays", 2, 20), client="b",
                               priority="interactive", timeout_s=30)
        await hold(worker, 3)  # one batch of four, two steps run
        batcher.forget(gone, "disconnected")
        worker.stop_stepping()
        assert_painted(await stays.result(), [20, 21])
        with pytest.raises(asyncio.CancelledError):
            await gone.result()
        reason = {"reason": "disconnected"}
        assert sample(batcher, "genaug_dropped_in_pipeline_total", **reason) == 2
        assert sample(batcher, "genaug_steps_saved_total", **reason) == 2 * (6 - 2)

    run(test)


def test_a_batch_nobody_waits_for_stops_within_one_step() -> None:
    async def test(batcher: Batcher, worker: GateWorker, inner: StandInWorker) -> None:
        big = batcher.submit(KEY, items("big", 4, 10), client="a", priority="bulk",
                             timeout_s=30)
        await hold(worker, 2)
        batcher.forget(big, "disconnected")
        worker.step(1)  # the boundary where the cut is read: no step runs after it
        after = batcher.submit(KEY, items("next", 1, 5), client="b", priority="bulk",
                               timeout_s=30)
        await hold(worker, 3)  # the next batch has started
        assert worker.events == ["run big x4", "run next x1"]
        assert inner.steps_run == 1
        worker.stop_stepping()
        assert_painted(await after.result(), [5])
        assert sample(batcher, "genaug_steps_saved_total", reason="disconnected") == 4 * 5

    run(test)


def test_a_deadline_during_generation_answers_504_at_the_deadline() -> None:
    async def test(batcher: Batcher, worker: GateWorker, inner: StandInWorker) -> None:
        job = batcher.submit(KEY, items("slow", 2, 10), client="a", priority="interactive",
                             timeout_s=0.5)
        await hold(worker, 2)  # held mid-batch, past the deadline below
        with pytest.raises(DeadlineExceededError, match="during generation"):
            await asyncio.wait_for(job.result(), timeout=5)
        assert inner.steps_run == 1  # answered while the worker was still held
        worker.stop_stepping()
        for _ in range(100):
            if sample(batcher, "genaug_steps_saved_total", reason="expired"):
                break
            await asyncio.sleep(0.02)
        assert sample(batcher, "genaug_steps_saved_total", reason="expired") == 2 * 5
        assert inner.steps_run == 1

    run(test)


def test_a_request_gone_while_its_batch_is_paused_is_cut_on_resume() -> None:
    async def test(batcher: Batcher, worker: GateWorker, inner: StandInWorker) -> None:
        bulk = batcher.submit(KEY, items("bulk", 2, 10), client="a", priority="bulk",
                              timeout_s=30)
        mate = batcher.submit(KEY, items("mate", 2, 30), client="c", priority="bulk",
                              timeout_s=30)
        await hold(worker, 2)
        worker.entered.clear()
        worker.gate.clear()  # hold the interactive batch at the gate while the bulk is paused
        batcher.submit(KEY, items("person", 1, 7), client="b", priority="interactive",
                       timeout_s=30)
        worker.step(1)
        await asyncio.to_thread(worker.entered.wait, 5)
        batcher.forget(bulk, "disconnected")  # while paused
        worker.stop_stepping()
        worker.gate.set()
        assert_painted(await mate.result(), [30, 31])
        assert sample(batcher, "genaug_steps_saved_total", reason="disconnected") == 2 * 5
        assert worker.events[-1] == "resume bulk x4"

    run(test)
