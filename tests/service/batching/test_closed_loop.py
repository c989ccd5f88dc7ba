"""Closed-loop clients share the generator by time: the batcher end to end, on virtual time.

The scenario of ``bench/service/closed_loop_share.py`` (issue 56, item 12) at the batcher's
level: two clients, each keeping two requests of ``n=4`` in flight, one asking images about
6x costlier than the other's; the costly client's share of generator time must stay in
0.4-0.6. The worker is a stand-in whose work moves a virtual clock (the batcher's clock, so
segments and slices are timed on it) by a per-image cost per step, plus the text encoding
before the first step and the decoding after the last, which no pause can split, as in the
pipeline. Before every step it lets the event loop run until nothing is ready, so an answered
client has asked again before the next step, as a real client does within a few
milliseconds; nothing here depends on how fast the machine is.

What the figure guards: the lag a client keeps between two of its requests, a group in the
pipeline or paused counting as competing, and the time slice at step boundaries (with any of
them gone the costly client takes 0.7-0.9 of the time, as the tree before time slices did).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytest

from genaug.service.batching.batcher import Batcher
from genaug.service.batching.items import Flight, GroupKey, Item, Outcome, Paused
from genaug.service.metrics import Metrics

IN_FLIGHT = 2
N = 4
COSTLY = GroupKey(height=256, width=256, steps=60)
CHEAP = GroupKey(height=64, width=64, steps=20)
CHEAP_TURBO = GroupKey(height=64, width=64, steps=2, scheduler="tcd", speed="turbo")


class Clock:
    """Virtual seconds: moved by the worker thread, read by both threads."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class Cost:
    """Virtual seconds per image: each denoising step, encoding before the first step,
    decoding after the last."""

    step_s: float
    encode_s: float = 0.002
    decode_s: float = 0.01


class VirtualWorker:
    """Runs a batch step by step on :class:`Clock` time, reading its flight between steps as
    the pipeline worker does; before each step, the event loop runs until it is idle."""

    def __init__(self, clock: Clock, costs: dict[GroupKey, Cost],
                 loop: asyncio.AbstractEventLoop) -> None:
        self.clock = clock
        self.costs = costs
        self.loop = loop

    def run(self, key: GroupKey, items: Sequence[Item], flight: Flight | None = None
            ) -> Outcome | Paused:
        self.clock.now += self.costs[key].encode_s * len(items)
        return self._go(key, list(items), flight, step=0)

    def _go(self, key: GroupKey, items: list[Item], flight: Flight | None, *, step: int
            ) -> Outcome | Paused:
        cost = self.costs[key]
        while step < key.steps:
            self._settle_loop()
            if flight is not None and flight.poll()[1]:
                return Paused(key, items, step, key.steps,
                              resume=functools.partial(self._go, key, items, step=step))
            self.clock.now += cost.step_s * len(items)
            step += 1
        self.clock.now += cost.decode_s * len(items)
        return Outcome(images=[np.zeros(item.output_shape, np.uint8) for item in items])

    def _settle_loop(self) -> None:
        async def settle() -> None:
            for _ in range(8):  # an answer, the client's wake-up, its next submit: a few rounds
                await asyncio.sleep(0)

        asyncio.run_coroutine_threadsafe(settle(), self.loop).result(timeout=10)


def costly_share(costs: dict[str, tuple[GroupKey, Cost]], *, warm_s: float = 30.0,
                 measure_s: float = 240.0, slice_ms: float = 1000.0) -> float:
    """Run the closed-loop clients of ``costs`` (client -> key, cost) together; the share of
    generator time of ``"costly"`` over ``measure_s`` virtual seconds after ``warm_s``."""
    clock = Clock()

    async def main() -> float:
        worker = VirtualWorker(clock, dict(costs.values()), asyncio.get_running_loop())
        batcher = Batcher(worker, max_batch_images=8, max_wait_ms=0, max_queue_images=512,
                          metrics=Metrics(), slice_ms=slice_ms, clock=clock)
        await batcher.start()
        stop = asyncio.Event()

        async def closed_loop(client: str, key: GroupKey, first_seed: int) -> None:
            seed = first_seed
            while not stop.is_set():
                batch = [Item("p", seed=seed + i, guidance=5.0, output_height=2,
                              output_width=2) for i in range(N)]
                request = batcher.submit(key, batch, client=client, priority="interactive",
                                         timeout_s=3600)
                await request.result()
                seed += N

        async def until(t: float) -> None:
            while clock() < t:
                await asyncio.sleep(0.001)

        def used() -> dict[str, float]:
            return {c: s.generation_s for c, s in batcher.activity.clients.items()}

        loops = [asyncio.create_task(closed_loop(client, key, 1000 * i))
                 for client, (key, _) in costs.items() for i in range(IN_FLIGHT)]
        try:
            await asyncio.wait_for(until(warm_s), timeout=60)
            before = used()
            await asyncio.wait_for(until(warm_s + measure_s), timeout=120)
            after = used()
        finally:
            stop.set()
            await batcher.stop()
            await asyncio.gather(*loops, return_exceptions=True)
        spent = {c: after[c] - before.get(c, 0.0) for c in costs}
        return spent["costly"] / sum(spent.values())

    return asyncio.run(main())


@pytest.mark.parametrize(
    "cheap",
    [
        pytest.param((CHEAP, Cost(step_s=0.0125)), id="64x64x20"),
        # A few-step batch: its encoding and decoding, which no pause splits, outweigh its
        # steps (the turbo speed mode; its own group key).
        pytest.param((CHEAP_TURBO, Cost(step_s=0.0125, encode_s=0.01, decode_s=0.06)),
                     id="turbo-64x64x2"),
    ],
)
def test_a_client_asking_costlier_images_gets_its_share_of_generator_time(
    cheap: tuple[GroupKey, Cost],
) -> None:
    """256x256 at 60 steps, 1.5 s of generator time per image (a batch of 8 takes 0.2 s a
    step), beside 64x64 at 20, 0.25 s per image: 6x apart, as on the tiny pipeline."""
    share = costly_share({"costly": (COSTLY, Cost(step_s=0.025)), "cheap": cheap})
    assert 0.4 <= share <= 0.6, f"costly client's share of generator time {share:.2f}"


def test_the_share_does_not_depend_on_the_slice() -> None:
    """A short slice switches more often, a long one less; the ledger keeps the lag."""
    costs = {"costly": (COSTLY, Cost(step_s=0.025)), "cheap": (CHEAP, Cost(step_s=0.0125))}
    for slice_ms in (100.0, 3000.0):
        share = costly_share(costs, slice_ms=slice_ms)
        assert 0.4 <= share <= 0.6, f"slice {slice_ms:g} ms: costly share {share:.2f}"
