"""The warm-up (service/pipeline/warmup.py): its plan, the compiled-shape tracker, and the
hot-path wrapper that reports each batch to it (service/pipeline/tracked.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from genaug.service.batching.items import GroupKey, Item, Outcome
from genaug.service.metrics import Metrics
from genaug.service.pipeline.tracked import TrackedWorker
from genaug.service.pipeline.warmup import WARMUP_STEPS, ShapeTracker, warmup_plan
from genaug.service.settings import Settings


def items(n: int, size: int = 64, seed: int = 7) -> list[Item]:
    return [
        Item("a red circle on a blue square", seed=seed + i, guidance=5.0, output_height=size,
             output_width=size)
        for i in range(n)
    ]


# -- the plan -------------------------------------------------------------------------------


def test_warmup_plan_without_compile_is_one_default_image_plus_the_listed_shapes() -> None:
    s = Settings(warmup_shapes="128x128:4")
    recipe = SimpleNamespace(name="r", height=256, width=256, guidance=3.0)
    plan = warmup_plan(s, [recipe], defaults=(64, 4, 5.0))
    assert [(p.key, p.batch, p.guidance) for p in plan] == [
        (GroupKey(64, 64, 4), 1, 5.0),
        (GroupKey(128, 128, WARMUP_STEPS), 4, 5.0),
    ]


def test_warmup_plan_with_compile_covers_recipes_and_the_default_at_full_batches() -> None:
    s = Settings(compile="regional", warmup_shapes="128x128:4, 64x64:8", max_batch_images=8)
    recipes = [
        SimpleNamespace(name="a", height=256, width=192, guidance=3.0),
        SimpleNamespace(name="b", height=64, width=64, guidance=1.0),  # shape listed already
        SimpleNamespace(
            name="lcm", height=256, width=192, guidance=1.0, scheduler="lcm",
            adapter=SimpleNamespace(name="lcm-lora", scale=0.8),
        ),
    ]
    plan = warmup_plan(s, recipes, defaults=(64, 4, 5.0))
    assert [(p.key, p.batch, p.guidance, p.source) for p in plan] == [
        (GroupKey(128, 128, WARMUP_STEPS), 4, 5.0, "GENAUG_WARMUP_SHAPES"),
        (GroupKey(64, 64, WARMUP_STEPS), 8, 5.0, "GENAUG_WARMUP_SHAPES"),
        (GroupKey(256, 192, WARMUP_STEPS), 8, 3.0, "recipe a"),
        # recipe lcm: recipe a's shape; its adapter is hotswapped, so it compiles nothing new
    ]


def test_warmup_plan_with_a_turbo_lora_compiles_every_shape_for_the_turbo_unet_too(
        tmp_path: Any) -> None:
    lora = tmp_path / "lcm.safetensors"
    lora.write_bytes(b"")  # the plan reads only the setting
    s = Settings(compile="regional", warmup_shapes="128x128:4", max_batch_images=8,
                 turbo_lora=lora, turbo_kind="lcm")
    plan = warmup_plan(s, [], defaults=(64, 4, 5.0))
    assert [(p.key.height, p.batch, p.key.speed, p.source) for p in plan] == [
        (128, 4, "quality", "GENAUG_WARMUP_SHAPES"), (64, 8, "quality", "default size"),
        (128, 4, "turbo", "GENAUG_WARMUP_SHAPES, turbo"), (64, 8, "turbo", "default size, turbo")]
    # Without a turbo LoRA turbo runs the one UNet: nothing more to compile.
    assert all(p.key.speed == "quality" for p in warmup_plan(
        Settings(compile="regional", max_batch_images=8), [], defaults=(64, 4, 5.0)))


# -- shape tracking -------------------------------------------------------------------------


def test_tracker_counts_the_graphs_compiled_after_warm_up_not_new_shapes() -> None:
    """A new shape is not a recompile (the batch dimension is dynamic; the UNet's batch counts
    guided images twice): what dynamo compiled after the warm-up is, once each."""
    metrics = Metrics()
    graphs = [1]
    tracker = ShapeTracker(active=True, on_recompile=metrics.recompiles.inc,
                           graphs=lambda: graphs[0])
    tracker.mark_compiled(GroupKey(64, 64, 2), 8)
    assert tracker.ran(GroupKey(64, 64, 2), 8) == 0  # before settle: the warm-up's own
    tracker.settle()
    assert tracker.observe(GroupKey(64, 64, 30, scheduler="euler"), 8) is False
    assert tracker.observe(GroupKey(64, 64, 30), 3) is True  # a shape first served
    assert tracker.ran(GroupKey(64, 64, 30), 3) == 0  # ... that compiled nothing
    graphs[0] = 3  # a new image size: dynamo compiled two graphs for it
    assert tracker.observe(GroupKey(80, 64, 4, adapter="x"), 3) is True
    assert tracker.ran(GroupKey(80, 64, 4, adapter="x"), 3) == 2
    assert tracker.ran(GroupKey(80, 64, 4, adapter="x"), 3) == 0  # counted once
    assert tracker.compiled_shapes == ["64x64:8", "64x64:3", "80x64:3"]
    assert tracker.recompiles == 2
    assert b"genaug_recompiles_total 2.0" in metrics.render()


def test_tracker_is_silent_without_compilation() -> None:
    tracker = ShapeTracker(active=False, on_recompile=lambda: pytest.fail("counted"))
    tracker.mark_compiled(GroupKey(64, 64, 2), 8)
    assert tracker.observe(GroupKey(128, 128, 2), 1) is False
    assert tracker.compiled_shapes == []


def test_tracked_worker_reports_every_batch_before_running_it() -> None:
    seen: list[tuple[int, int]] = []
    graphs = [0]

    class Inner:
        def run(self, key: GroupKey, batch: Any, flight: Any = None) -> Outcome:
            seen.append((key.height, len(batch)))
            graphs[0] += len(batch) == 1  # a batch of one compiles here (as if)
            return Outcome(images=[np.zeros(i.output_shape, np.uint8) for i in batch])

    tracker = ShapeTracker(active=True, graphs=lambda: graphs[0])
    tracker.settle()
    worker = TrackedWorker(Inner(), tracker)
    worker.run(GroupKey(64, 64, 2), items(2))
    worker.run(GroupKey(64, 64, 2), items(2))
    worker.run(GroupKey(64, 64, 2), items(1))
    assert seen == [(64, 2), (64, 2), (64, 1)]
    assert tracker.compiled_shapes == ["64x64:2", "64x64:1"]
    assert tracker.recompiles == 1  # what compiled while a batch ran, counted after it