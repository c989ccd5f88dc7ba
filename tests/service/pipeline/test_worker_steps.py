"""The real pipeline worker stopped between denoising steps: paused and resumed, or cut.

On the tiny pipeline (batch-invariant, float32, CPU) every image must equal, bit for bit,
the same image made by an uninterrupted batch: after a pause with other batches run in
between (same scheduler, another adapter state), and after its batch mates were cut.
Schedulers with per-image state between steps are included: ``dpmpp_2m`` keeps a multistep
history shaped like the latents, ``euler_a`` draws noise from each image's generator.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import torch

from genaug.service.batching.items import Flight, GroupKey, Item, Outcome, Paused, to_end
from genaug.service.pipeline.worker import PipelineWorker

SCHEDULERS = ["default", "euler_a", "dpmpp_2m"]


def key(scheduler: str = "default", **kw: Any) -> GroupKey:
    return GroupKey(height=64, width=64, steps=5, scheduler=scheduler, **kw)


def batch(n: int = 4, base: int = 0) -> list[Item]:
    """Guided and unguided images, zero and text negatives: every per-row input differs."""
    return [
        Item(f"prompt {i}", seed=base + i, guidance=5.0 if i % 2 == 0 else 1.0,
             negative_prompt=None if i % 3 else "blurry", output_height=64, output_width=64)
        for i in range(n)
    ]


class Script(Flight):
    """A flight that says, at the boundary before step ``k`` (counted per poll), what the test
    scripted: ``{k: ("pause",)}`` or ``{k: ("drop", rows)}``."""

    def __init__(self, script: dict[int, tuple[Any, ...]]) -> None:
        super().__init__()
        self.script = script
        self.polls = 0

    def poll(self) -> tuple[frozenset[int], bool]:
        word = self.script.get(self.polls, ())
        self.polls += 1
        if word[:1] == ("pause",):
            self.pause()
        if word[:1] == ("drop",):
            self.drop(word[1])
        answer = super().poll()
        self.go_on()
        return answer


@pytest.fixture(scope="module")
def worker(tiny_model: Any) -> PipelineWorker:
    return PipelineWorker(tiny_model)


def plain(worker: PipelineWorker, k: GroupKey, items: list[Item]) -> Outcome:
    return to_end(worker.run(k, items))


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_a_paused_batch_resumes_to_the_same_images(worker: PipelineWorker, scheduler: str) -> None:
    items = batch()
    reference = plain(worker, key(scheduler), items)
    paused = worker.run(key(scheduler), items, Script({2: ("pause",)}))
    assert isinstance(paused, Paused) and (paused.step, paused.steps) == (2, 5)
    # Other work in between, on the same named scheduler (its cached instance is not the
    # paused batch's) and at another size.
    plain(worker, key(scheduler), batch(3, base=50))
    plain(worker, GroupKey(height=32, width=32, steps=3, scheduler=scheduler), batch(2))
    again = paused.resume(Script({1: ("pause",)}))
    assert isinstance(again, Paused) and again.step == 3
    outcome = to_end(again)
    assert outcome.errors == {} and outcome.dropped == {}
    np.testing.assert_array_equal(np.stack(outcome.images), np.stack(reference.images))


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_cut_rows_leave_their_mates_exactly_as_they_were(
    worker: PipelineWorker, scheduler: str
) -> None:
    items = batch(5)
    reference = plain(worker, key(scheduler), items)
    outcome = to_end(worker.run(key(scheduler), items, Script({2: ("drop", [1, 2]),
                                                                3: ("drop", [4])})))
    assert outcome.dropped == {1: 3, 2: 3, 4: 2}  # steps not run per dropped image
    assert outcome.good() == [0, 3]
    for i in (0, 3):
        np.testing.assert_array_equal(outcome.images[i], reference.images[i])


def test_img2img_rows_cut_mid_batch_keep_their_mates(worker: PipelineWorker) -> None:
    rng = np.random.default_rng(0)
    source = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    k = key("dpmpp_2m", mode="img2img", strength=0.8)
    items = [Item(f"p{i}", seed=i, guidance=4.0, output_height=64, output_width=64,
                  source=source) for i in range(3)]
    reference = plain(worker, k, items)
    outcome = to_end(worker.run(k, items, Script({1: ("drop", [0])})))
    assert outcome.good() == [1, 2]
    for i in (1, 2):
        np.testing.assert_array_equal(outcome.images[i], reference.images[i])


def test_a_batch_with_every_row_dropped_stops_without_decoding(worker: PipelineWorker) -> None:
    steps: list[int] = []
    original = worker.sampler.start

    def start(k: GroupKey, items: Any) -> Any:
        run = original(k, items)
        step = run.step
        run.step = lambda: (steps.append(run.index), step())  # type: ignore[method-assign]
        return run

    worker.sampler.start = start  # type: ignore[method-assign]
    try:
        outcome = to_end(worker.run(key(), batch(3), Script({2: ("drop", [0, 1, 2])})))
    finally:
        worker.sampler.start = original  # type: ignore[method-assign]
    assert steps == [0, 1]
    assert outcome.dropped == {0: 3, 1: 3, 2: 3} and outcome.good() == []


def test_compiled_shapes_finish_dropped_rows_but_never_serve_them(tiny_model: Any) -> None:
    fixed = PipelineWorker(tiny_model, cut_rows=False)  # as with GENAUG_COMPILE
    items = batch(3)
    reference = plain(fixed, key(), items)
    outcome = to_end(fixed.run(key(), items, Script({1: ("drop", [1])})))
    assert outcome.dropped == {1: 0} and outcome.good() == [0, 2]
    for i in (0, 2):
        np.testing.assert_array_equal(outcome.images[i], reference.images[i])


def test_out_of_memory_between_steps_halves_and_keeps_every_image(
    worker: PipelineWorker,
) -> None:
    items = batch(4)
    reference = plain(worker, key(), items)
    original = worker.sampler.start

    def start(k: GroupKey, batch_items: Any) -> Any:
        run = original(k, batch_items)
        inner = run.step

        def step() -> None:
            if run.index == 2 and len(run.items) == 4:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            inner()

        run.step = step  # type: ignore[method-assign]
        return run

    worker.sampler.start = start  # type: ignore[method-assign]
    try:
        outcome = to_end(worker.run(key(), items, Script({})))
    finally:
        worker.sampler.start = original  # type: ignore[method-assign]
    assert outcome.errors == {}
    np.testing.assert_array_equal(np.stack(outcome.images), np.stack(reference.images))


def test_several_batches_paused_at_once_resume_in_any_order_to_the_same_images(
    worker: PipelineWorker,
) -> None:
    """Two batches on the same named scheduler paused at once, a third run in between,
    resumed out of order and paused again: each image as made by an uninterrupted batch."""
    ka, kb = key("dpmpp_2m"), GroupKey(height=32, width=32, steps=4, scheduler="dpmpp_2m")
    a_items, b_items = batch(4), batch(3, base=20)
    ref_a, ref_b = plain(worker, ka, a_items), plain(worker, kb, b_items)
    pa = worker.run(ka, a_items, Script({1: ("pause",)}))
    pb = worker.run(kb, b_items, Script({2: ("pause",)}))
    assert isinstance(pa, Paused) and isinstance(pb, Paused)
    plain(worker, key("euler_a"), batch(2, base=40))
    pa = pa.resume(Script({2: ("pause",)}))
    assert isinstance(pa, Paused) and pa.step == 3
    out_b, out_a = to_end(pb), to_end(pa)
    np.testing.assert_array_equal(np.stack(out_a.images), np.stack(ref_a.images))
    np.testing.assert_array_equal(np.stack(out_b.images), np.stack(ref_b.images))


def test_time_slices_through_the_batcher_keep_every_image_and_seed(
    worker: PipelineWorker,
) -> None:
    """The batcher on the real worker with a zero slice: two clients' batches of different
    sizes and schedulers yield to each other at step boundaries (as often as timing makes
    them), a third client's request of the first key rides along; every image equals the
    same request made alone, so pausing never changes an image or a seed's meaning."""
    from genaug.service.batching.batcher import Batcher
    from genaug.service.metrics import Metrics

    ka, kb = key("dpmpp_2m"), GroupKey(height=32, width=32, steps=6, scheduler="euler_a")
    requests = {"a": (ka, batch(3)), "b": (kb, batch(2, base=30)), "c": (ka, batch(1, base=60))}
    reference = {name: np.stack(plain(worker, k, list(items)).images)
                 for name, (k, items) in requests.items()}

    async def main() -> dict[str, np.ndarray]:
        batcher = Batcher(worker, max_batch_images=4, max_wait_ms=0, max_queue_images=100,
                          metrics=Metrics(), slice_ms=0)
        await batcher.start()
        try:
            jobs = {name: batcher.submit(k, list(items), client=name, priority="interactive",
                                         timeout_s=120)
                    for name, (k, items) in requests.items()}
            made = {name: await job.result() for name, job in jobs.items()}
            preemptions = batcher.metrics.registry.get_sample_value("genaug_preemptions_total")
            assert preemptions is not None and preemptions >= 1
            assert batcher.paused_batches == 0
            return made
        finally:
            await batcher.stop()

    made = asyncio.run(main())
    for name, images in made.items():
        np.testing.assert_array_equal(images, reference[name], err_msg=name)
