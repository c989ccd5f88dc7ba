"""People first and work nobody waits for, through HTTP on the real tiny pipeline.

The service's :class:`~genaug.service.testing.GateWorker` steps the real worker on command
(``stepping``), so each test forces its interleaving: a person's request arriving while a
pool batch is mid-way, a client leaving mid-batch, a deadline passing mid-batch.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from genaug.service.pool.open import open_pool


def post(live: Any, body: dict[str, Any], client: str, timeout: float = 60) -> httpx.Response:
    return httpx.post(live.url + "/v1/generate", json=body, timeout=timeout,
                      headers={"X-Client-Id": client})


def hold(worker: Any, ahead: int) -> int:
    """Step the worker ``ahead`` boundaries past where it is and hold it; return the count."""
    target = worker.boundaries + ahead
    worker.hold_at(target)
    worker.wait_boundary(target)
    return int(target)


def stepping(live: Any, held_at: int) -> tuple[Any, int]:
    """Put the worker on command, held at boundary ``held_at`` from now (1: the next batch's
    start, 2: after its first step ...); return it and the boundary count it started at."""
    worker = live.worker
    worker.stepping = True
    start = int(worker.boundaries)
    worker.hold_at(start + held_at)
    return worker, start


def test_a_person_goes_first_within_one_step_while_a_pool_fills(
    make_service: Any, tmp_path: Path, shapes_recipe: str
) -> None:
    recipes = tmp_path / "recipes.yaml"
    recipes.write_text(shapes_recipe.replace("steps: 2", "steps: 6"))
    live = make_service(recipes=recipes, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=12, max_batch_images=4)
    worker = live.worker
    worker.stepping = True
    hold(worker, 3)  # mid-way through some pool batch (or at the start of one)
    with ThreadPoolExecutor(1) as pool:
        person = pool.submit(post, live, {"prompt": "person", "n": 1}, "notebook")
        live.wait_until(lambda: live.admitted("notebook") == 1, what="the person's request")
        worker.stop_stepping()
        assert person.result().status_code == 200
    at = worker.events.index("run person x1")
    # (the answer can come back before the worker has picked the paused batch up again)
    live.wait_until(lambda: len(worker.events) > at + 1, what="the pool batch resumed")
    events = list(worker.events)
    assert events[at - 1].startswith("paused at "), events
    assert events[at + 1].startswith("resume "), events  # the pool batch goes on from there
    assert live.metric("genaug_preemptions_total") >= 1
    deadline = time.monotonic() + 60
    while True:
        fill = httpx.get(f"{live.url}/v1/recipes/shapes").json()["fill"]
        if all(v >= 12 for v in fill.values()):
            break
        assert time.monotonic() < deadline, fill
        time.sleep(0.1)
    live.stop()
    with open_pool(tmp_path / "pool.db", capacity_per_label=12) as store:
        (pool_id,) = store.reads.pools()
        for label, indices in store.reads.plan_indices(pool_id).items():
            assert sorted(indices) == list(range(12)), label  # none repeated, none skipped


def test_a_client_leaving_mid_batch_frees_the_worker_at_the_next_step(
    make_service: Any,
) -> None:
    live = make_service(max_batch_images=8, max_wait_ms=0)
    worker, start = stepping(live, 3)  # two steps of the abandoned batch, then held
    with ThreadPoolExecutor(2) as pool:
        abandoned = pool.submit(post, live, {"prompt": "abandoned", "n": 4, "steps": 20},
                                "impatient", 1.0)
        worker.wait_boundary(start + 3)
        with pytest.raises(httpx.ReadTimeout):
            abandoned.result()  # the client hangs up after 1 s
        live.wait_until(lambda: worker.dropped() == {0, 1, 2, 3}, what="the disconnect")
        after = pool.submit(post, live, {"prompt": "next", "n": 1}, "patient")
        live.wait_until(lambda: live.admitted("patient") == 1, what="the next request")
        worker.step(1)  # the boundary where the cut is read
        worker.wait_boundary(start + 4)  # ... and the next batch's first boundary
        assert worker.events[-2:] == ["run abandoned x4", "run next x1"]
        worker.stop_stepping()
        assert after.result().status_code == 200
    saved = live.metric("genaug_steps_saved_total", 'reason="disconnected"')
    assert saved == 4 * (20 - 2)
    assert live.metric("genaug_dropped_in_pipeline_total", 'reason="disconnected"') == 4


def test_a_deadline_passing_mid_batch_is_504_at_once_and_stops_the_work(
    make_service: Any,
) -> None:
    live = make_service(max_batch_images=8, max_wait_ms=0)
    worker, start = stepping(live, 2)
    with ThreadPoolExecutor(1) as pool:
        late = pool.submit(post, live, {"prompt": "late", "n": 2, "steps": 20,
                                        "timeout_s": 1.0}, "late")
        worker.wait_boundary(start + 2)
        r = late.result()
        assert r.status_code == 504, r.text
        assert worker.boundaries == start + 2  # answered while the worker was still held
    worker.stop_stepping()
    live.wait_until(
        lambda: live.metric("genaug_steps_saved_total", 'reason="expired"') == 2 * (20 - 1),
        what="the expired rows cut",
    )


def test_a_client_waiting_gets_the_generator_at_the_next_step_and_images_stay_the_same(
    make_service: Any,
) -> None:
    """Time slices through HTTP: an interactive batch yields to another client's request
    (``slice_ms=0``: at the next step), ``/v1/status`` shows the paused batch, and both
    answers are the images the same requests get alone."""
    live = make_service(max_batch_images=4, max_wait_ms=0, slice_ms=0)
    big = {"prompt": "big", "n": 3, "steps": 12, "seed": 5}
    small = {"prompt": "small", "n": 1, "steps": 4, "height": 32, "width": 32, "seed": 9}
    worker, start = stepping(live, 3)  # two steps of the big batch, then held
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, live, big, "trainer")
        worker.wait_boundary(start + 3)
        second = pool.submit(post, live, small, "notebook")
        live.wait_until(lambda: live.admitted("notebook") == 1, what="the small request")
        hold(worker, 2)  # the big batch paused at this boundary; the small one at its first
        status = httpx.get(live.url + "/v1/status", timeout=30).json()
        assert status["paused_batches"] == 1
        assert live.metric("genaug_paused_batches") == 1
        assert "run small x1" in worker.events and "paused at 2" in worker.events
        worker.stop_stepping()
        paused_big, paused_small = first.result(), second.result()
    assert paused_big.status_code == paused_small.status_code == 200
    assert live.metric("genaug_preemptions_total") >= 1
    assert post(live, big, "trainer").content == paused_big.content
    assert post(live, small, "notebook").content == paused_small.content
