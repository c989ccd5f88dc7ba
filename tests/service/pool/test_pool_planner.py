"""The pre-generation planner (PoolPlanner) against real stores, without a pipeline.

The batches it plans are completed by hand (a made-up outcome) so each test decides exactly
when the store thread commits: that is how the overshoot race of issue 10.1 is forced.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _postgres import PgCluster
from PIL import Image

from genaug.service.api.errors import status_of
from genaug.service.batching.items import IdleWork, Outcome
from genaug.service.errors import PoolUnavailableError
from genaug.service.jobs.fill_jobs import FillJobs
from genaug.service.pool.open import open_pool
from genaug.service.pool.planner import PoolPlanner
from genaug.service.pool.serving import PoolServing
from genaug.service.pool.store import PoolStore
from genaug.service.recipes.load import parse_recipes
from genaug.service.recipes.spec import LabelSpec, Recipe


def _recipe(**kwargs: Any) -> Recipe:
    fields: dict[str, Any] = {
        "name": "r", "labels": {"a": LabelSpec(prompts=["x"]), "b": LabelSpec(prompts=["y"])},
        "height": 8, "width": 8, "steps": 1, "guidance": 0.0,
    }
    fields.update(kwargs)
    return Recipe(**fields)


def _outcome(work: IdleWork) -> Outcome:
    """What a worker would return: one image per item, pixel value from its seed."""
    images = []
    for item in work.items:
        image = np.full(item.output_shape, item.seed % 251, np.uint8)
        if item.source is not None:  # a stand-in img2img: keep the source visible
            image[..., :1] = item.source[: item.output_height, : item.output_width, :1]
        images.append(image)
    return Outcome(images=images)


def _in_store_thread(fn: Callable[[], None]) -> None:
    thread = threading.Thread(target=fn, name="genaug-store")
    thread.start()
    thread.join(30)


@pytest.fixture
def store(target: str) -> Iterator[PoolStore]:
    """A store on both backends (conftest.py's ``target``), four images per label."""
    s = open_pool(target, capacity_per_label=4)
    yield s
    s.close()


def test_a_commit_between_the_planners_reads_plans_no_extra_batch(store: PoolStore) -> None:
    """Issue 10.1, forced: the store thread commits a batch right after the planner has read
    the pool's fill. The old planner then read its in-flight count without that batch (it had
    just left it) and planned one batch too many; counting both in the pool, in one snapshot,
    cannot."""
    planner = PoolPlanner({"r": _recipe(labels={"a": LabelSpec(prompts=["x"])})}, store,
                          model_hash="m", pregenerate=True)
    first = planner.next_idle_batch(2)
    second = planner.next_idle_batch(2)
    assert first is not None and second is not None
    assert planner.next_idle_batch(2) is None  # 4 planned: the target

    read = store.stats
    armed = [True]

    def stats_then_commit(*args: Any, **kwargs: Any) -> Any:
        result = read(*args, **kwargs)
        if armed[0]:  # the hook: the store thread commits `first` between the two reads
            armed[0] = False
            _in_store_thread(lambda: first.on_done(_outcome(first)))
        return result

    store.stats = stats_then_commit  # type: ignore[method-assign]
    assert not armed[0] or planner.next_idle_batch(2) is None
    assert not armed[0], "the planner never read the pool"
    _in_store_thread(lambda: second.on_done(_outcome(second)))
    assert planner.next_idle_batch(2) is None
    stats = read(planner.pool_ids["r"], ["a"])["a"]
    assert (stats.fill, stats.generated, stats.reserved) == (4, 4, 0)


def test_planned_exactly_to_target_with_commits_interleaved(store: PoolStore) -> None:
    planner = PoolPlanner({"r": _recipe()}, store, model_hash="m", pregenerate=True)
    pending: list[IdleWork] = []
    made = 0
    rng = np.random.default_rng(0)
    while True:
        work = planner.next_idle_batch(3)
        if work is not None:
            pending.append(work)
            made += len(work.items)
        if pending and (work is None or rng.random() < 0.5):
            done = pending.pop(int(rng.integers(len(pending))))
            _in_store_thread(lambda done=done: done.on_done(_outcome(done)))  # type: ignore[misc]
        elif work is None:
            break
    assert made == 8
    stats = store.stats(planner.pool_ids["r"], ["a", "b"])
    assert {k: (s.fill, s.generated, s.reserved) for k, s in stats.items()} == {
        "a": (4, 4, 0), "b": (4, 4, 0)}


def test_a_failed_batch_releases_its_reservation(store: PoolStore) -> None:
    planner = PoolPlanner({"r": _recipe(labels={"a": LabelSpec(prompts=["x"])})}, store,
                          model_hash="m", pregenerate=True)
    work = planner.next_idle_batch(4)
    assert work is not None and planner.next_idle_batch(4) is None
    assert work.on_failed is not None
    work.on_failed(RuntimeError("out of memory"))
    again = planner.next_idle_batch(4)
    assert again is not None
    assert [it.seed for it in again.items] != [it.seed for it in work.items]  # new indices
    again.on_done(_outcome(again))
    assert store.stats(planner.pool_ids["r"], ["a"])["a"].fill == 4


def test_shared_targets_and_local_ones(store: PoolStore) -> None:
    recipes = {"r": _recipe()}
    a = PoolPlanner(recipes, store, model_hash="m", pregenerate=False)
    b = PoolPlanner(recipes, store, model_hash="m", pregenerate=False)
    assert a.next_idle_batch(8) is None
    FillJobs(a).fill("r", 2)  # a fill job on one replica: every replica fills to it
    work = b.next_idle_batch(8)
    assert work is not None and len(work.items) == 2
    b.raise_target("r", 3)  # in-process pregenerate: this planner alone
    assert a.next_idle_batch(8) is not None  # a's other label
    assert a.next_idle_batch(8) is None
    assert b.next_idle_batch(8) is not None
    with pytest.raises(Exception, match="exceeds the pool capacity"):
        FillJobs(a).fill("r", 5)


def test_recipe_fields_reach_the_group_key_and_items(store: PoolStore) -> None:
    recipe = parse_recipes("""
recipes:
  - name: depth
    height: 16
    width: 16
    steps: 2
    guidance: 2.0
    scheduler: euler_a
    adapter: {name: lcm, scale: 0.7}
    output_channels: 1
    labels:
      a: {prompts: ["x"]}
      b: {prompts: ["y"], adapter: {name: other, scale: 1.5}}
""", path=Path("r.yaml"))["depth"]
    planner = PoolPlanner({"depth": recipe}, store, model_hash="m", pregenerate=True)
    works = [planner.next_idle_batch(4), planner.next_idle_batch(4)]
    keys = {}
    for work in works:
        assert work is not None
        label = "a" if work.items[0].prompt == "x" else "b"
        keys[label] = work.key
        assert all(it.channels == 1 and it.output_shape == (16, 16, 1) for it in work.items)
        work.on_done(_outcome(work))
    assert (keys["a"].scheduler, keys["a"].adapter, keys["a"].adapter_scale) == (
        "euler_a", "lcm", 0.7)
    assert (keys["b"].adapter, keys["b"].adapter_scale, keys["b"].mode) == ("other", 1.5, "text")
    sample = store.sample(planner.pool_ids["depth"], ["a", "b"], 8)
    assert sample.images.shape == (8, 16, 16, 1)


def _write_images(folder: Path, n: int, size: int = 20) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(n):
        pixels = np.full((size, size, 3), 40 * (k + 1), np.uint8)
        Image.fromarray(pixels).save(folder / f"img{k}.png")


def test_variant_labels_plan_img2img_from_their_folder(tmp_path: Path, store: PoolStore) -> None:
    root = tmp_path / "real"
    _write_images(root / "wounds" / "P", 2)
    text = """
recipes:
  - name: v
    height: 16
    width: 16
    steps: 2
    guidance: 2.0
    labels:
      P: {prompts: ["a wound"], images: wounds/P, strength: 0.4, variants_per_image: 3}
      Q: {prompts: ["one each"], images: wounds/P, variants_per_image: 1}
      T: {prompts: ["text only"]}
"""
    recipe = parse_recipes(text, path=Path("r.yaml"))["v"]
    planner = PoolPlanner({"v": recipe}, store, model_hash="m", pregenerate=True,
                          data_root=root)
    # images x variants_per_image, capped at the capacity (4)
    assert (planner.target("v", "P"), planner.target("v", "Q"), planner.target("v", "T")) == (
        4, 2, 4)
    seen: list[tuple[str | None, int]] = []
    while (work := planner.next_idle_batch(4)) is not None:
        if work.key.mode == "img2img" and work.items[0].prompt == "a wound":
            assert work.key.strength == 0.4 and (work.key.height, work.key.width) == (16, 16)
            for item in work.items:
                assert item.source is not None and item.source.shape == (16, 16, 3)
                assert item.source.dtype == np.uint8
                seen.append((item.source_hash, int(item.source[0, 0, 0])))
        elif work.key.mode == "text":
            assert all(item.source is None for item in work.items)
        work.on_done(_outcome(work))
    # capacity 4 caps P at 4 variants: sources alternate, so both images are used twice
    assert sorted(v for _, v in seen) == [40, 40, 80, 80]
    assert len({h for h, _ in seen}) == 2
    sample = store.sample(planner.pool_ids["v"], ["P"], 10)
    assert sample.sources is not None and set(sample.sources) == {h for h, _ in seen}
    assert store.fill(planner.pool_ids["v"]) == {"P": 4, "Q": 2, "T": 4}
    # the pool identity follows the folder's content
    _write_images(root / "wounds" / "P", 3)
    other = PoolPlanner({"v": recipe}, store, model_hash="m", pregenerate=True, data_root=root)
    assert other.pool_ids["v"] != planner.pool_ids["v"]


def test_outage_pauses_planning_keeps_finished_batches_and_resumes() -> None:
    cluster = PgCluster()
    try:
        cluster.start()
        store = open_pool(cluster.new_database(), capacity_per_label=4)
        planner = PoolPlanner({"r": _recipe(labels={"a": LabelSpec(prompts=["x"])})}, store,
                              model_hash="m", pregenerate=True)
        work = planner.next_idle_batch(2)
        assert work is not None
        cluster.stop()
        work.on_done(_outcome(work))  # the database is gone: the batch is kept
        assert planner.paused and planner.unsaved_images == 2
        assert planner.next_idle_batch(2) is None and planner.paused
        serving = PoolServing(planner)
        with pytest.raises(PoolUnavailableError) as info:
            serving.detail("r")
        assert status_of(info.value) == 503 and info.value.retry_after_s
        assert serving.summary("r")["fill"] == {"a": 0}  # last known counts, no error
        cluster.start()
        deadline = time.monotonic() + 30
        rest = planner.next_idle_batch(2)  # stores the kept batch first, then plans
        while rest is None and time.monotonic() < deadline:  # as the batcher's back-off does
            time.sleep(0.5)
            rest = planner.next_idle_batch(2)
        assert rest is not None and not planner.paused and planner.unsaved_images == 0
        rest.on_done(_outcome(rest))
        assert planner.next_idle_batch(2) is None
        stats = store.stats(planner.pool_ids["r"], ["a"])["a"]
        assert (stats.fill, stats.generated, stats.reserved) == (4, 4, 0)
        store.close()
    finally:
        cluster.destroy()
