"""Unit tests of how a batch's generator time is split between its requests
(:mod:`genaug.service.batching.answers`): parts taken by the real fair queue, real costs."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

import pytest

from genaug.service.batching.answers import charge, shares
from genaug.service.batching.items import GroupKey, Item
from genaug.service.batching.queue import Batch, FairQueue, Part
from genaug.service.batching.request import QueuedRequest
from genaug.service.batching.usage import Activity
from genaug.service.metrics import Metrics

KEY = GroupKey(height=64, width=64, steps=20)
SEEDS = random.Random(41)  # 63-bit seeds, as the pool planner draws them


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def request(loop: asyncio.AbstractEventLoop, client: str, n: int, *,
            guidance: float) -> QueuedRequest:
    items = [Item(f"a handwritten digit {i}, {client}", seed=SEEDS.getrandbits(63),
                  guidance=guidance, output_height=64, output_width=64) for i in range(n)]
    return QueuedRequest(key=KEY, items=items, client=client, priority="bulk", deadline=1e12,
                         loop=loop)


def test_a_segment_is_split_by_cost_with_guidance_counting_twice(
    loop: asyncio.AbstractEventLoop,
) -> None:
    queue = FairQueue()
    queue.push(request(loop, "trainer-a", 3, guidance=5.0))  # two UNet rows per image
    queue.push(request(loop, "notebook", 1, guidance=1.0))   # one row: no unconditional half
    head = queue.head()
    assert head is not None
    parts = queue.take(KEY, capacity=8, now=0.0, opened_by=head[:2])
    by_client = dict(zip((p.request.client for p in parts), shares(parts, 4), strict=True))
    assert by_client == pytest.approx({"trainer-a": 6 / 7, "notebook": 1 / 7})

    activity = Activity(Metrics())
    batch = Batch(KEY, parts)
    charge(batch, 0.7, queue=queue, activity=activity)
    charge(batch, 0.7, queue=queue, activity=activity)  # resumed after a pause: adds up
    assert batch.seconds == pytest.approx(1.4)
    assert activity.clients["trainer-a"].generation_s == pytest.approx(1.2)
    assert activity.clients["notebook"].generation_s == pytest.approx(0.2)
    assert queue.served("trainer-a") - queue.served("notebook") == pytest.approx(1.0)


def test_parts_without_a_cost_split_by_image_count(loop: asyncio.AbstractEventLoop) -> None:
    parts = [Part(request(loop, "a", 3, guidance=5.0), start=0, count=3),
             Part(request(loop, "b", 1, guidance=5.0), start=0, count=1)]
    assert shares(parts, 4) == [0.75, 0.25]
    assert shares([], 0) == []
