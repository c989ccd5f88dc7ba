"""The batcher's word to a batch in flight, stepped on command: people first within one step,
time slices between clients, work nobody waits for cut between steps, deadlines during
generation.

A stand-in worker (``test_batcher.StandInWorker``, ``steps`` per batch, reading its flight
before each) wrapped in the service's :class:`~genaug.service.testing.GateWorker` with
``stepping`` on: the test decides when each step boundary is passed, and the batcher's
clock (what segments and slices are timed on) is a :class:`Clock` the test moves by hand,
so every interleaving below is forced, not hoped for. The same behaviour on the real
pipeline is tested in ``tests/service/pipeline/test_worker_steps.py`` and through HTTP in
``tests/service/api/test_preemption_api.py``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

import pytest
from test_batcher import (
    KEY,
    OTHER_KEY,
    OUTPUT,
    StandInWorker,
    assert_painted,
    items,
    pixel,
    sample,
)

from genaug.service.batching import batcher as batcher_module
from genaug.service.batching.batcher import Batcher
from genaug.service.batching.items import GroupKey, IdleWork, Item, Outcome
from genaug.service.errors import DeadlineExceededError
from genaug.service.metrics import Metrics
from genaug.service.testing import GateWorker

THIRD_KEY = GroupKey(height=24, width=24, steps=1)
OTHER = OUTPUT[OTHER_KEY]


class Clock:
    """The batcher's clock, moved by the test (:meth:`advance`); read from both threads."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def run(
    test: Callable[[Batcher, GateWorker, StandInWorker], Awaitable[None]],
    *,
    steps: int = 6,
    idle_source: object = None,
    max_batch_images: int = 4,
    clock: Clock | None = None,
    slice_ms: float = 100.0,
) -> None:
    """Run ``test`` against a started batcher whose stand-in worker steps on command, on
    ``clock`` (a :class:`Clock` that stands still unless the test moves it)."""
    inner = StandInWorker(steps=steps)
    worker = GateWorker(inner, gate_timeout_s=20)
    worker.stepping = True

    async def main() -> None:
        batcher = Batcher(
            worker, max_batch_images=max_batch_images, max_wait_ms=0, max_queue_images=1000,
            metrics=Metrics(), idle_source=idle_source, slice_ms=slice_ms,
            clock=clock or Clock(),
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


def test_a_lone_client_is_never_paused() -> None:
    """However long its batch runs: other work of its own group (another key, another
    client id under the same API key) waits for it."""
    clock = Clock()

    async def test(batcher: Batcher, worker: GateWorker, inner: StandInWorker) -> None:
        first = batcher.submit(KEY, items("first", 4, 100), client="key-0123abcd/one",
                               priority="interactive", timeout_s=30)
        await hold(worker, 3)
        clock.advance(60.0)
        second = batcher.submit(OTHER_KEY, items("second", 1, 7, OTHER_KEY),
                                client="key-0123abcd/two", priority="interactive", timeout_s=30)
        worker.stop_stepping()
        await asyncio.gather(first.result(), second.result())
        assert worker.events == ["run first x4", "run second x1"]
        assert sample(batcher, "genaug_preemptions_total") == 0

    run(test, clock=clock)


def test_an_interactive_batch_yields_to_a_less_served_client_once_its_slice_is_used() -> None:
    """Served time is measured per segment: the paused batch's two segments are charged to
    its client, and the images are exactly those of an uninterrupted run."""
    clock = Clock()

    async def test(batcher: Batcher, worker: GateWorker, inner: StandInWorker) -> None:
        first = batcher.submit(KEY, items("first", 4, 100), client="a",
                               priority="interactive", timeout_s=30)
        await hold(worker, 3)  # two steps run
        clock.advance(0.05)
        second = batcher.submit(OTHER_KEY, items("second", 1, 7, OTHER_KEY), client="b",
                                priority="interactive", timeout_s=30)
        await hold(worker, 4)  # b waits, but a has used half its slice: a runs a step more
        assert worker.events == ["run first x4"]
        clock.advance(0.05)  # the slice is used: a yields at this boundary
        await hold(worker, 6)  # a paused at 3; b's batch at its second boundary
        assert batcher.paused_batches == 1
        assert sample(batcher, "genaug_paused_batches") == 1
        clock.advance(0.02)
        await hold(worker, 11)  # b's batch ran to its end (a: 0.1 s, b: 0.02 s); a resumed
        clock.advance(0.25)
        worker.stop_stepping()
        assert_painted(await second.result(), [7], OTHER)
        assert_painted(await first.result(), range(100, 104))
        assert worker.events == ["run first x4", "paused at 3", "run second x1",
                                 "resume first x4"]
        assert inner.steps_run == 6 + 6  # none run twice
        assert sample(batcher, "genaug_preemptions_total") == 1
        assert sample(batcher, "genaug_paused_batches") == 0
        used = {name: c.generation_s for name, c in batcher.activity.clients.items()}
        assert used == pytest.approx({"a": 0.35, "b": 0.02})
        assert batcher.activity.recent_shares() == pytest.approx({"a": 0.35 / 0.37,
                                                                  "b": 0.02 / 0.37})
        assert (batcher.queue.served("a"), batcher.queue.served("b")) == pytest.approx(
            (0.35, 0.02))

    run(test, clock=clock)


def test_a_paused_bulk_batch_resumes_in_its_groups_turn_and_pauses_again() -> None:
    """People first; then, among bulk work, the least-served group: a newcomer's batch
    before the paused batch of a group already served a second."""
    clock = Clock()

    async def test(batcher: Batcher, worker: GateWorker, inner: StandInWorker) -> None:
        bulk = batcher.submit(KEY, items("bulk", 4, 100), client="t", priority="bulk",
                              timeout_s=30)
        await hold(worker, 2)
        clock.advance(1.0)
        # (another key: bulk images of the same key would ride in the interactive batch)
        later_bulk = batcher.submit(OTHER_KEY, items("later", 1, 50, OTHER_KEY), client="u",
                                    priority="bulk", timeout_s=30)
        one = batcher.submit(KEY, items("one", 1, 1), client="n", priority="interactive",
                             timeout_s=30)
        await hold(worker, 3)  # the bulk batch paused at step 1; "one" held at its first step
        await hold(worker, 3 + 6 + 6)  # "one" ran, then u's batch; the bulk batch resumed
        assert_painted(await one.result(), [1])
        assert_painted(await later_bulk.result(), [50], OTHER)
        two = batcher.submit(KEY, items("two", 1, 2), client="n", priority="interactive",
                             timeout_s=30)
        worker.stop_stepping()
        await asyncio.gather(bulk.result(), two.result())
        assert worker.events == [
            "run bulk x4", "paused at 1", "run one x1", "run later x1", "resume bulk x4",
            "paused at 1", "run two x1", "resume bulk x4",
        ]
        assert_painted(await bulk.result(), range(100, 104))
        assert sample(batcher, "genaug_preemptions_total") == 2

    run(test, clock=clock)


def third(prompt: str, seed: int) -> list[Item]:
    return [Item(prompt, seed=seed + i, guidance=1.0, output_height=3, output_width=3)
            for i in range(2)]


def test_several_batches_pause_up_to_the_bound_and_the_least_served_resumes_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(batcher_module, "MAX_PAUSED", 2)
    clock = Clock()

    async def test(batcher: Batcher, worker: GateWorker, inner: StandInWorker) -> None:
        a = batcher.submit(KEY, items("a", 2, 10), client="a", priority="interactive",
                           timeout_s=30)
        await hold(worker, 2)
        clock.advance(1.0)
        b = batcher.submit(OTHER_KEY, items("b", 2, 20, OTHER_KEY), client="b",
                           priority="interactive", timeout_s=30)
        await hold(worker, 3)  # a paused at 1 (served 1 s); b's batch held at its start
        clock.advance(1.5)
        c = batcher.submit(THIRD_KEY, third("c", 30), client="c", priority="interactive",
                           timeout_s=30)
        await hold(worker, 4)  # b paused at 0 (served 1.5 s) for newcomer c; c runs
        assert batcher.paused_batches == 2
        assert sample(batcher, "genaug_paused_batches") == 2
        clock.advance(5.0)  # c is far ahead now, but two batches are paused: c runs on
        worker.stop_stepping()
        await asyncio.gather(a.result(), b.result(), c.result())
        assert worker.events == ["run a x2", "paused at 1", "run b x2", "paused at 0",
                                 "run c x2", "resume a x2", "resume b x2"]
        assert_painted(await a.result(), [10, 11])
        assert_painted(await b.result(), [20, 21], OTHER)
        assert_painted(await c.result(), [30, 31], (3, 3))
        assert inner.steps_run == 3 * 6
        assert batcher.paused_batches == 0

    run(test, clock=clock)


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
        request = batcher.submit(KEY, items("slow", 2, 10), client="a", priority="interactive",
                             timeout_s=0.5)
        await hold(worker, 2)  # held mid-batch, past the deadline below
        with pytest.raises(DeadlineExceededError, match="during generation"):
            await asyncio.wait_for(request.result(), timeout=5)
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


def test_the_slice_setting_is_a_bounded_number_of_milliseconds() -> None:
    from pydantic import ValidationError

    from genaug.service.settings import Settings

    assert Settings(device="cpu").slice_ms == 1000.0
    assert Settings(device="cpu", slice_ms=0).slice_ms == 0.0
    for bad in (-1, 60_001):
        with pytest.raises(ValidationError, match="slice_ms"):
            Settings(device="cpu", slice_ms=bad)
