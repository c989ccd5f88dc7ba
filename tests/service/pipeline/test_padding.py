"""CUDA graphs' batch sizes (GENAUG_COMPILE_MODE=reduce-overhead|max-autotune): the set of
sizes, the warm-up that compiles each, and the padding (service/pipeline/tracked.py's
PaddedWorker) that keeps every batch on one of them without changing a real row's image.

The tiny pipeline is bit-identical per image whatever its batch (it runs its modules per
image), so a padded batch's real rows must equal the unpadded batch's exactly. CUDA graphs
themselves exist only on a GPU; on the CPU torch.compile skips them, and the slow test below
checks that the whole path (warm-up of every size, padding, no recompile) runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from genaug.client import Client
from genaug.service.batching.items import Flight, GroupKey, Item, Outcome, Paused, to_end
from genaug.service.pipeline.acceleration import Acceleration, AccelerationError
from genaug.service.pipeline.acceleration_options import AccelerationOptions
from genaug.service.pipeline.tiny import build_tiny_pipeline
from genaug.service.pipeline.tracked import PaddedWorker, TrackedWorker
from genaug.service.pipeline.warmup import (
    WARMUP_STEPS,
    ShapeTracker,
    batch_sizes,
    padded_size,
    warmup_plan,
)
from genaug.service.pipeline.worker import PipelineWorker
from genaug.service.settings import Settings
from genaug.service.testing import load_tiny, start_service

KEY = GroupKey(64, 64, 3)


def items(n: int, seed: int = 7) -> list[Item]:
    return [Item(f"shape {i}", seed=seed + i, guidance=5.0 if i % 2 else 3.0,
                 output_height=64, output_width=64) for i in range(n)]


class Recording:
    """The worker under the padding: records how many items each batch had."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.batches: list[int] = []

    def run(self, key: GroupKey, batch: Sequence[Item], flight: Flight | None = None) -> Any:
        self.batches.append(len(batch))
        return self.inner.run(key, batch, flight)


@pytest.fixture(scope="module")
def generator() -> PipelineWorker:
    return PipelineWorker(load_tiny())


@pytest.fixture(scope="module")
def reference(generator: PipelineWorker) -> np.ndarray:
    outcome = to_end(generator.run(KEY, items(3)))
    assert outcome.errors == {}
    return np.stack(outcome.images)


# -- the sizes ------------------------------------------------------------------------------


def test_batch_sizes_are_powers_of_two_and_the_largest_batch() -> None:
    assert batch_sizes(1) == (1,)
    assert batch_sizes(3) == (1, 2, 3)
    assert batch_sizes(8) == (1, 2, 4, 8)
    assert batch_sizes(12) == (1, 2, 4, 8, 12)
    assert batch_sizes(16) == (1, 2, 4, 8, 16)
    with pytest.raises(ValueError):
        batch_sizes(0)
    sizes = batch_sizes(12)
    assert [padded_size(n, sizes) for n in range(1, 13)] == [1, 2, 4, 4, 8, 8, 8, 8, 12, 12,
                                                             12, 12]
    assert padded_size(20, sizes) == 20  # above the largest: as it is (never happens)


def test_compile_mode_needs_compilation() -> None:
    with pytest.raises(ValueError, match="GENAUG_COMPILE_MODE=reduce-overhead needs"):
        Settings(compile_mode="reduce-overhead")
    with pytest.raises(AccelerationError, match="GENAUG_COMPILE=unet or regional"):
        AccelerationOptions(compile_mode="max-autotune")
    with pytest.raises(ValueError, match="compile_mode"):
        Settings(compile="unet", compile_mode="fastest")  # type: ignore[arg-type]
    s = Settings(compile="unet", compile_mode="max-autotune")
    assert AccelerationOptions.from_settings(s).cuda_graphs
    assert not AccelerationOptions(compile="unet",
                                   compile_mode="max-autotune-no-cudagraphs").cuda_graphs
    assert not AccelerationOptions(compile="unet").cuda_graphs
    assert AccelerationOptions.parse("compile=unet,compile_mode=reduce-overhead").label == (
        "compile=unet+compile_mode=reduce-overhead"
    )


def test_warmup_with_cuda_graphs_compiles_every_size_of_every_shape() -> None:
    s = Settings(compile="unet", compile_mode="reduce-overhead", max_batch_images=4,
                 warmup_shapes="128x128:3")
    recipe = SimpleNamespace(name="r", height=96, width=96, guidance=3.0)
    plan = warmup_plan(s, [recipe], defaults=(64, 4, 5.0))
    assert [(p.key.height, p.batch, p.source) for p in plan] == [
        (128, 4, "GENAUG_WARMUP_SHAPES"),  # a listed batch of 3 runs padded to 4
        (96, 4, "recipe r"), (96, 2, "recipe r"), (96, 1, "recipe r"),
        (64, 4, "default size"), (64, 2, "default size"), (64, 1, "default size"),
    ]
    assert all(p.key.steps == WARMUP_STEPS for p in plan)
    # Without CUDA graphs a compiled service warms the largest batch only, as before.
    plain = warmup_plan(Settings(compile="regional", max_batch_images=4), [recipe],
                        defaults=(64, 4, 5.0))
    assert [p.batch for p in plain] == [4, 4]


# -- the padding ----------------------------------------------------------------------------


def test_padded_rows_are_made_and_thrown_away_and_real_rows_are_bit_identical(
    generator: PipelineWorker, reference: np.ndarray
) -> None:
    inner = Recording(generator)
    outcome = to_end(PaddedWorker(inner, (1, 2, 4)).run(KEY, items(3)))
    assert inner.batches == [4]
    assert len(outcome.images) == 3 and outcome.errors == {} and outcome.dropped == {}
    assert np.array_equal(np.stack(outcome.images), reference)


def test_a_batch_of_a_listed_size_is_not_padded(generator: PipelineWorker) -> None:
    inner = Recording(generator)
    PaddedWorker(inner, (1, 2, 4)).run(KEY, items(2))
    assert inner.batches == [2]


def test_a_pause_speaks_of_the_real_items_and_resumes_to_the_same_images(
    generator: PipelineWorker, reference: np.ndarray
) -> None:
    flight = Flight()
    flight.pause()
    batch = items(3)
    paused = PaddedWorker(generator, (1, 2, 4)).run(KEY, batch, flight)
    assert isinstance(paused, Paused)
    assert list(paused.items) == batch and (paused.step, paused.steps) == (0, 3)
    flight.go_on()
    outcome = paused.resume(flight)
    assert isinstance(outcome, Outcome) and len(outcome.images) == 3
    assert np.array_equal(np.stack(outcome.images), reference)


def test_dropping_some_real_rows_keeps_the_others(
    generator: PipelineWorker, reference: np.ndarray
) -> None:
    flight = Flight()
    flight.drop([1])
    outcome = to_end(PaddedWorker(generator, (1, 2, 4)).run(KEY, items(3), flight))
    assert set(outcome.dropped) == {1} and outcome.errors == {}
    for i in (0, 2):
        assert np.array_equal(outcome.images[i], reference[i])


def test_dropping_every_real_row_stops_the_padded_batch(generator: PipelineWorker) -> None:
    flight = Flight()
    flight.drop([0, 1, 2])
    steps: list[int] = []
    real = generator.sampler.start

    def counting_start(key: GroupKey, batch: Sequence[Item]) -> Any:
        run = real(key, batch)
        step = run.step

        def counted() -> None:
            steps.append(1)
            step()

        run.step = counted  # type: ignore[method-assign]
        return run

    generator.sampler.start = counting_start  # type: ignore[method-assign]
    try:
        outcome = to_end(PaddedWorker(generator, (1, 2, 4)).run(KEY, items(3), flight))
    finally:
        del generator.sampler.start
    assert set(outcome.dropped) == {0, 1, 2} and len(outcome.images) == 3
    assert steps == []  # the padding row alone was not made


def test_speed_pads_outside_the_tracker_so_warm_sizes_are_no_recompile() -> None:
    acceleration = Acceleration.setup(load_tiny(), Settings(
        compile="unet", compile_mode="reduce-overhead", max_batch_images=4))
    info = acceleration.info()
    assert (info["compile_mode"], info["batch_sizes"]) == ("reduce-overhead", [1, 2, 4])

    class Stand:
        def run(self, key: GroupKey, batch: Sequence[Item], flight: Any = None) -> Outcome:
            return Outcome(images=[np.zeros((64, 64, 3), np.uint8)] * len(batch))

    worker = acceleration.wrap(Stand())
    assert isinstance(worker, PaddedWorker) and isinstance(worker.inner, TrackedWorker)
    for size in (1, 2, 4):
        acceleration.tracker.mark_compiled(KEY, size)
    for n in (1, 2, 3, 4):
        assert len(to_end(worker.run(KEY, items(n))).images) == n
    assert acceleration.tracker.recompiles == 0
    assert ShapeTracker(active=False).compiled_shapes == []


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_cuda_graph_mode_warms_every_size_and_serves_any_batch_without_compiling() -> None:
    import dataclasses

    import torch

    torch._dynamo.reset()
    try:
        model = dataclasses.replace(load_tiny(), pipeline=build_tiny_pipeline())
        with start_service(model, compile="unet", compile_mode="reduce-overhead",
                           max_batch_images=3, ready_timeout=900) as live:
            import httpx

            acceleration = httpx.get(live.url + "/v1/info", timeout=10).json()["acceleration"]
            assert acceleration["batch_sizes"] == [1, 2, 3]
            assert set(acceleration["compiled_shapes"]) == {"64x64:1", "64x64:2", "64x64:3"}
            with Client(live.url, timeout=900) as client:
                for n in (1, 2, 3):
                    client.generate("a red circle", n=n, seed=1, steps=2, timeout_s=900)
            assert live.metric("genaug_recompiles_total") == 0
    finally:
        torch._dynamo.reset()
