"""The real pipeline worker stopped between denoising steps: paused and resumed, or cut.

On the tiny pipeline (batch-invariant, float32, CPU) every image must equal, bit for bit,
the same image made by an uninterrupted batch: after a pause with other batches run in
between (same scheduler, another adapter state), and after its batch mates were cut.
Schedulers with per-image state between steps are included: ``dpmpp_2m`` keeps a multistep
history shaped like the latents, ``euler_a`` draws noise from each image's generator.
"""

from __future__ import annotations

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
