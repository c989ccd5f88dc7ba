"""Unit tests of the fair queue: a synchronous structure, driven directly (no batcher, no loop
thread), with requests whose futures live on a private event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from genaug.service.batching.items import GroupKey, Item
from genaug.service.batching.queue import FairQueue
from genaug.service.batching.request import Priority, QueuedRequest

KEY = GroupKey(height=8, width=8, steps=1)
OTHER = GroupKey(height=16, width=16, steps=1)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def request(
    loop: asyncio.AbstractEventLoop,
    client: str,
    n: int,
    *,
    priority: Priority = "bulk",
    key: GroupKey = KEY,
    deadline: float = 1e12,
) -> QueuedRequest:
    items = [Item(f"{client}{i}", seed=i, guidance=1.0, output_height=8, output_width=8)
             for i in range(n)]
    return QueuedRequest(key=key, items=items, client=client, priority=priority, deadline=deadline,
               loop=loop)


def taken(parts: list) -> list[str]:  # type: ignore[type-arg]
    return sorted(item.prompt for part in parts for item in part.items)


def test_round_robin_one_image_per_client_per_turn(loop: asyncio.AbstractEventLoop) -> None:
    queue = FairQueue()
    flood = request(loop, "a", 10)
    queue.push(flood)
    queue.push(request(loop, "b", 2))
    assert queue.images == 12 and queue.requests == 2
    head = queue.head()
    assert head is not None and head[1] == "a"
    parts = queue.take(KEY, capacity=4, now=0.0, opened_by=head[:2])
    assert taken(parts) == ["a0", "a1", "b0", "b1"]
    assert queue.images == 8 and flood.next_index == 2 and flood.started == 0.0
    # a opened that batch, so it goes to the back; b is gone, so a is next again
    assert queue.by_client() == {"a": 8}


def test_interactive_before_bulk_and_the_opener_goes_last(
    loop: asyncio.AbstractEventLoop,
) -> None:
    queue = FairQueue()
    queue.push(request(loop, "bulk", 3))
    queue.push(request(loop, "x", 1, priority="interactive"))
    queue.push(request(loop, "y", 2, priority="interactive"))
    head = queue.head()
    assert head is not None and head[:2] == ("interactive", "x")
    parts = queue.take(KEY, capacity=2, now=1.0, opened_by=head[:2])
    assert taken(parts) == ["x0", "y0"]
    head = queue.head()
    assert head is not None and head[:2] == ("interactive", "y")
    parts = queue.take(KEY, capacity=3, now=2.0, opened_by=head[:2])
    assert taken(parts) == ["bulk0", "bulk1", "y1"]


def test_a_batch_holds_one_key_and_other_keys_keep_their_place(
    loop: asyncio.AbstractEventLoop,
) -> None:
    queue = FairQueue()
    queue.push(request(loop, "a", 2, key=OTHER))
    queue.push(request(loop, "b", 2))
    assert queue.waiting(KEY)[1] == 2 and queue.waiting(OTHER)[1] == 2
    parts = queue.take(KEY, capacity=8, now=0.0, opened_by=("bulk", "b"))
    assert taken(parts) == ["b0", "b1"]
    assert queue.by_client() == {"a": 2} and queue.images == 2


def test_prune_removes_expired_and_cancelled_jobs_with_their_images(
    loop: asyncio.AbstractEventLoop,
) -> None:
    queue = FairQueue()
    late = request(loop, "late", 3, deadline=5.0)
    gone = request(loop, "gone", 2)
    kept = request(loop, "kept", 1)
    for j in (late, gone, kept):
        queue.push(j)
    gone.cancel("disconnected")
    assert queue.by_client() == {"late": 3, "kept": 1}  # cancelled images are not counted
    removed = queue.prune(now=10.0)
    assert {j.client for j in removed} == {"late", "gone"}
    assert queue.images == 1 and queue.requests == 1
    assert [j.client for j in queue.drain()] == ["kept"] and queue.images == 0



def test_a_keys_client_ids_share_one_turn(loop: asyncio.AbstractEventLoop) -> None:
    """Hierarchical identity: ten client ids under one API key get the turn of one key."""
    queue = FairQueue()
    many = "key-0000000a"
    for i in range(10):
        queue.push(request(loop, f"{many}/c{i}", 4))
    queue.push(request(loop, "key-0000000b/only", 40))
    counts: dict[str, int] = {"a": 0, "b": 0}
    seen: set[str] = set()
    for _ in range(5):
        head = queue.head()
        assert head is not None
        for part in queue.take(KEY, capacity=8, now=0.0, opened_by=head[:2]):
            counts["a" if part.request.client.startswith(many) else "b"] += part.count
            if part.request.client.startswith(many):
                seen.add(part.request.client)
    assert counts == {"a": 20, "b": 20}
    assert len(seen) == 10  # the key's ids take its turn in rotation


def test_a_group_is_a_key_or_a_client_ids_first_part_and_a_trainer_keeps_its_name() -> None:
    from genaug.service.batching.queue import group_of, trainer_of

    assert group_of("key-0123abcd/trainer") == "key-0123abcd"
    assert group_of("key-0123abcd") == "key-0123abcd"
    assert group_of("team/trainer") == "team"  # a trainer's ranks and workers: one turn
    assert group_of("key-0123abcd/trainer-a/r0/w1") == "key-0123abcd"
    assert group_of("ip:10.0.0.1") == "ip:10.0.0.1"
    assert trainer_of("key-0123abcd/trainer-a/r0/w1") == "key-0123abcd/trainer-a"
    assert trainer_of("trainer-a/r1/w3") == trainer_of("trainer-a") == "trainer-a"
    assert trainer_of("key-0123abcd") == "key-0123abcd"
    assert trainer_of("ip:10.0.0.1") == "ip:10.0.0.1"


BIG = GroupKey(height=32, width=32, steps=3)  # 16x the latent pixels, 3x the steps of KEY


def test_batches_are_opened_by_cost_served_not_by_turns(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Two saturating clients, one whose images cost 48x more: each gets about half the
    generator cost, not half the batches."""
    from genaug.service.batching.queue import image_cost

    queue = FairQueue()
    queue.push(request(loop, "heavy", 1000, key=BIG))
    queue.push(request(loop, "light", 100000))
    cost = {"heavy": 0.0, "light": 0.0}
    for _ in range(400):
        head = queue.head()
        assert head is not None
        parts = queue.take(head[2].key, capacity=4, now=0.0, opened_by=head[:2])
        for part in parts:
            for item in part.items:
                cost[part.request.client] += image_cost(part.request.key, item)
        queue.settle(parts, sum(p.cost for p in parts) * 1e-3)  # time proportional to cost
    share = cost["heavy"] / (cost["heavy"] + cost["light"])
    assert 0.45 <= share <= 0.55, share


def test_guidance_doubles_an_images_cost() -> None:
    from genaug.service.batching.queue import image_cost

    plain = Item("p", seed=0, guidance=1.0, output_height=8, output_width=8)
    guided = Item("p", seed=0, guidance=5.0, output_height=8, output_width=8)
    assert image_cost(BIG, guided) == 2 * image_cost(BIG, plain) == 2 * 4 * 4 * 3


def test_a_group_joining_late_gets_no_saved_up_credit(loop: asyncio.AbstractEventLoop) -> None:
    queue = FairQueue(slice_s=0.5)
    queue.push(request(loop, "a", 100))
    for _ in range(10):
        head = queue.head()
        assert head is not None
        queue.settle(queue.take(KEY, capacity=4, now=0.0, opened_by=head[:2]), 1.0)
    queue.push(request(loop, "b", 100))  # b is new: it starts level with a, then they alternate
    assert queue.served("b") == queue.served("a") == 10.0
    opened = []
    for _ in range(6):
        head = queue.head()
        assert head is not None
        opened.append(head[1])
        queue.settle(queue.take(KEY, capacity=1, now=0.0, opened_by=head[:2]), 1.0)
    assert opened.count("a") == 3 and opened.count("b") == 3


def test_the_opener_gets_the_first_image_even_in_a_batch_of_one(
    loop: asyncio.AbstractEventLoop,
) -> None:
    queue = FairQueue()
    queue.push(request(loop, "a", 5))
    queue.push(request(loop, "b", 5))
    parts = queue.take(KEY, capacity=1, now=0.0, opened_by=("bulk", "b"))
    assert taken(parts) == ["b0"]


def test_share_of_generator_time_over_the_last_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    from genaug.service.batching import usage
    from genaug.service.metrics import Metrics

    clock = [1000.0]
    monkeypatch.setattr(usage.time, "monotonic", lambda: clock[0])
    activity = usage.Activity(Metrics())
    activity.used("old", 9.0)
    clock[0] += 61.0  # "old" falls out of the window but keeps its lifetime total
    activity.used("a", 3.0)
    activity.used("b", 1.0)
    assert activity.recent_shares() == {"a": 0.75, "b": 0.25}
    assert activity.clients["old"].generation_s == 9.0


def test_settle_charges_measured_time_not_the_formula(loop: asyncio.AbstractEventLoop) -> None:
    """The formula says ``a``'s images are cheap; measured time says they are not: after
    settling, ``b`` (served less time) opens the next batch."""
    queue = FairQueue()
    queue.push(request(loop, "a", 10))
    queue.push(request(loop, "b", 10, key=BIG))
    a_parts = queue.take(KEY, capacity=4, now=0.0, opened_by=("bulk", "a"))
    queue.settle(a_parts, seconds=10.0)  # 4 small images took 10 s
    b_parts = queue.take(BIG, capacity=4, now=0.0, opened_by=("bulk", "b"))
    queue.settle(b_parts, seconds=1.0)  # 4 big ones took 1 s
    head = queue.head()
    assert head is not None and head[1] == "b"
    assert (queue.served("a"), queue.served("b")) == (10.0, 1.0)


def test_a_segments_time_is_split_over_its_images_by_cost(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """One batch, two groups: a guided image costs two UNet rows, an unguided one."""
    queue = FairQueue()
    guided = request(loop, "g", 1)
    guided.items[0] = Item("g0", seed=0, guidance=5.0, output_height=8, output_width=8)
    queue.push(guided)
    queue.push(request(loop, "u", 1))
    parts = queue.take(KEY, capacity=4, now=0.0, opened_by=("bulk", "g"))
    queue.settle(parts, 3.0)  # one segment (start to pause)
    queue.settle(parts, 1.5)  # the next (resume to end)
    assert (queue.served("g"), queue.served("u")) == (3.0, 1.5)


def test_a_client_between_two_requests_keeps_its_lag_up_to_one_slice(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """A closed-loop client has nothing queued for a moment after each answer; when it asks
    again it keeps the lag it had (the ledger remembers it), at most one slice of it."""
    queue = FairQueue(slice_s=1.0)
    queue.push(request(loop, "deep", 1000))
    queue.push(request(loop, "loop", 4, key=BIG))
    deep = queue.take(KEY, capacity=4, now=0.0, opened_by=("bulk", "deep"))
    queue.hold(deep)
    queue.settle(deep, 5.3)
    queue.release(deep)
    mine = queue.take(BIG, capacity=4, now=0.0, opened_by=("bulk", "loop"))
    queue.hold(mine)
    queue.settle(mine, 4.6)
    queue.release(mine)  # its answer goes out: "loop" has nothing queued or in the pipeline
    queue.push(request(loop, "loop", 4, key=BIG))
    assert queue.served("loop") == pytest.approx(4.6)  # 0.7 behind, kept (not reset to 5.3)
    head = queue.head()
    assert head is not None and head[1] == "loop"
    queue.settle(queue.take(BIG, capacity=4, now=0.0, opened_by=head[:2]), 0.5)
    deep = queue.take(KEY, capacity=4, now=0.0, opened_by=("bulk", "deep"))
    queue.settle(deep, 4.0)  # "loop" now 4.2 s behind; its next request keeps one slice
    queue.push(request(loop, "loop", 4, key=BIG))
    assert queue.served("loop") == pytest.approx(9.3 - 1.0)


def test_a_group_in_the_pipeline_counts_as_competing(loop: asyncio.AbstractEventLoop) -> None:
    """While a batch of "a" runs with nothing of "a" queued, a newcomer joins level with
    "a", and the ledger is not reset as if the generator were idle."""
    queue = FairQueue(slice_s=0.1)
    queue.push(request(loop, "a", 4))
    parts = queue.take(KEY, capacity=4, now=0.0, opened_by=("bulk", "a"))
    queue.hold(parts)
    queue.settle(parts, 2.0)  # a first segment (then paused, say)
    queue.push(request(loop, "b", 1))
    assert queue.served("b") == 2.0 == queue.served("a")
    assert queue.least_served("bulk", exclude={"a"}) == 2.0
    assert queue.least_served("bulk", exclude={"b"}) is None
    queue.release(parts)
    queue.take(KEY, capacity=4, now=0.0, opened_by=("bulk", "b"))
    queue.push(request(loop, "c", 1))  # nobody competes now: everyone starts even
    assert queue.served("a") == queue.served("c") == 0.0
