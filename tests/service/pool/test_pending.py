"""Pending work, read two ways that must agree: KEDA's query in the pool database and the
gauge's figure from the planner's counts (:mod:`genaug.service.pool.pending`).

The pools are filled with the store's own methods, as the product fills them: shared targets
(``set_target``, what ``/fill`` does), reservations and batches of images with the planner's
63-bit seeds (``reserve``/``add``, some rejected by a judge's scores), a label the judge stopped
(``record_stop``) and a second pool. The query runs as KEDA runs it: its exact text, on a
connection of its own.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from genaug.service.pool.pending import PENDING_BY_POOL_SQL, PENDING_SQL, pending_images
from genaug.service.pool.store import PoolStore
from genaug.service.pool.types import LabelStats
from genaug.service.recipes.load import load_recipes
from genaug.service.recipes.spec import Recipe, pool_id

RECIPES = Path(__file__).parents[3] / "recipes" / "generic.yaml"


@pytest.fixture(scope="module")
def recipe() -> Recipe:
    """A shipped recipe: its labels, its prompts, its seeds."""
    return next(iter(load_recipes(RECIPES).values()))


def query(target: str, sql: str) -> list[tuple[object, ...]]:
    """``sql`` as KEDA runs it: the text as it is, on a connection of its own."""
    if target.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(target) as conn:
            return [tuple(row) for row in conn.execute(sql).fetchall()]
    with sqlite3.connect(target) as conn:
        return [tuple(row) for row in conn.execute(sql).fetchall()]


def store_batch(store: PoolStore, recipe: Recipe, pid: str, label: str, n: int,
                *, rejected: int = 0) -> None:
    """Reserve ``n`` images of ``label`` and store them with the planner's seeds; the last
    ``rejected`` of them scored under the judge's ``min_score``."""
    res = store.reserve(pid, label, n, target=10**6)
    assert res is not None and res.count == n
    seeds = [recipe.plan(label, i).seed for i in res.indices]
    images = np.full((n, 8, 8, 3), 128, np.uint8)
    keep = [True] * (n - rejected) + [False] * rejected
    store.add(pid, label, images, seeds, model_hash="m", reservation=res,
              scores=[0.95 if k else 0.1 for k in keep], keep=keep)


def test_the_query_and_the_gauge_count_the_same_pending_images(
    store: PoolStore, target: str, recipe: Recipe
) -> None:
    first, second, third = recipe.label_names[:3]
    pid = pool_id(recipe, "weights-a")
    old = pool_id(recipe, "weights-b")  # the same recipe under another model: another pool
    assert max(recipe.plan(first, i).seed for i in range(8)) > 2**53  # 63-bit, as drawn

    assert query(target, PENDING_SQL) == [(0,)]  # an empty database owes nothing
    store.set_target(pid, [first, second, third], 6)
    store.set_target(old, [first], 4)
    store_batch(store, recipe, pid, first, 4)
    store_batch(store, recipe, pid, second, 5, rejected=3)  # 2 accepted: 4 still owed
    in_flight = store.reserve(pid, second, 2, target=6)  # in flight still holds a GPU
    assert in_flight is not None
    store.stops.record(pid, third, "stopped: the judge accepted 0 of the 50 images of label "
                      f"{third!r}", "shots:0.9")  # never made: not pending
    store_batch(store, recipe, old, first, 1)

    stats = {p: store.stats(p) for p in (pid, old)}
    stopped = {p: set(store.stops.read(p)) for p in (pid, old)}
    assert stopped == {pid: {third}, old: set()}
    figures = {p: pending_images(stats[p], stopped[p]) for p in (pid, old)}
    assert figures == {pid: (6 - 4) + (6 - 2), old: 4 - 1}
    assert query(target, PENDING_BY_POOL_SQL) == sorted(figures.items())
    assert query(target, PENDING_SQL) == [(sum(figures.values()),)]

    # Every asked target met (a label above its target owes nothing, never less than 0).
    store.release(in_flight)
    store_batch(store, recipe, pid, first, 3)
    store_batch(store, recipe, pid, second, 4)
    store_batch(store, recipe, old, first, 3)
    stats = {p: store.stats(p) for p in (pid, old)}
    assert {p: pending_images(stats[p], stopped[p]) for p in (pid, old)} == {pid: 0, old: 0}
    assert query(target, PENDING_BY_POOL_SQL) == sorted([(pid, 0), (old, 0)])
    assert query(target, PENDING_SQL) == [(0,)]


def test_a_label_without_a_target_or_stopped_owes_nothing() -> None:
    stats = {"circle": LabelStats(fill=9, target=0), "square": LabelStats(fill=1, target=5),
             "triangle": LabelStats(fill=0, target=7)}
    assert pending_images(stats) == 4 + 7
    assert pending_images(stats, {"triangle"}) == 4
    assert pending_images({"circle": LabelStats(fill=12, target=5)}) == 0


def test_the_gauge_counts_a_fill_until_its_targets_are_met(
    make_service: Any, tmp_path: Path, shapes_recipes_file: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the real app: ``/fill`` on a service that does not pre-generate raises the
    targets; while the images are being made ``genaug_pool_pending_images{recipe}`` says how
    many are owed, and once the fill is reached it says 0."""
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pregenerate=False, max_batch_images=4)
    gauge = ("genaug_pool_pending_images", 'recipe="shapes"')
    # A store that takes a moment, as a database across a network does: the planner then
    # always asks for the next batch before the last one is stored.
    store = live.state.pools.planner.store
    add = store.add

    def slow_add(*args: Any, **kwargs: Any) -> int:
        time.sleep(0.3)
        return add(*args, **kwargs)

    monkeypatch.setattr(store, "add", slow_add)
    assert live.metric(*gauge) == 0  # nothing asked
    scrape = httpx.get(live.url + "/metrics", timeout=10).text
    assert "# HELP genaug_pool_pending_images " in scrape and "aggregate with max" in scrape
    live.worker.gate.clear()  # hold generation: the first batch waits in the pipeline
    r = httpx.post(f"{live.url}/v1/recipes/shapes/fill", json={"per_label": 3}, timeout=30)
    assert r.status_code == 200, r.text
    labels = list(r.json()["fill"])
    assert len(labels) == 3
    live.wait_until(lambda: live.metric(*gauge) > 0, timeout=30, what="pending images > 0")
    assert live.metric(*gauge) == 3 * len(labels)  # every image owed, none stored yet
    live.worker.gate.set()
    # Only the gauge is read until it says 0: a recipe's detail would read the pool afresh.
    live.wait_until(lambda: live.metric(*gauge) == 0, timeout=30, what="pending images 0")
    fill = httpx.get(f"{live.url}/v1/recipes/shapes", timeout=10).json()["fill"]
    assert all(fill[label] >= 3 for label in labels), fill
