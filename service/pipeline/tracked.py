"""The hot-path wrappers of the batcher's worker while compilation is on.

With ``GENAUG_COMPILE`` set, the lifespan wraps the :class:`PipelineWorker` in a
:class:`TrackedWorker` (:meth:`~genaug.service.pipeline.acceleration.Acceleration.wrap`): every
batch reports its shape to the :class:`~genaug.service.pipeline.warmup.ShapeTracker` before it
runs, and after it, whatever dynamo compiled meanwhile is counted as a recompile. With CUDA graphs
(``GENAUG_COMPILE_MODE`` reduce-overhead or max-autotune) a :class:`PaddedWorker` around it
pads each batch to the next of a few batch sizes, all compiled at warm-up. With compilation
off the worker is not wrapped at all.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..batching.items import Flight, GroupKey, Item, Outcome, Paused, Worker
from .warmup import ShapeTracker, padded_size

__all__ = ["PaddedWorker", "TrackedWorker"]


class TrackedWorker:
    """A :class:`Worker` that reports each batch's shape, then runs it.

    Example::

        worker = TrackedWorker(generator, tracker)
        worker.run(key, items)   # observe, generator.run(key, items), then tracker.ran(...)
    """

    def __init__(self, inner: Worker, tracker: ShapeTracker) -> None:
        self.inner = inner
        self.tracker = tracker

    def run(
        self, key: GroupKey, items: Sequence[Item], flight: Flight | None = None
    ) -> Outcome | Paused:
        self.tracker.observe(key, len(items))
        try:
            return self.inner.run(key, items, flight)
        finally:  # compiled during the batch: a recompile (paused batches count as they go)
            self.tracker.ran(key, len(items))


class PaddedWorker:
    """A :class:`Worker` that runs each batch at the next of ``sizes`` (padding rows are
    copies of the batch's last item, made and thrown away), so a CUDA-graph UNet only ever
    sees shapes recorded at warm-up.

    An image depends on its own item, never on its batch mates (the batching contract), so
    the real rows' images are those of the unpadded batch. The outcome, a pause and its resume
    speak of the real items only; once every real row is dropped the padding rows are
    dropped too, and the batch stops.

    Example::

        worker = PaddedWorker(TrackedWorker(generator, tracker), sizes=(1, 2, 4, 8))
        worker.run(key, items[:3]).images   # 3 images; the UNet ran a batch of 4
    """

    def __init__(self, inner: Worker, sizes: Sequence[int]) -> None:
        self.inner = inner
        self.sizes = tuple(sorted(sizes))

    def run(
        self, key: GroupKey, items: Sequence[Item], flight: Flight | None = None
    ) -> Outcome | Paused:
        n = len(items)
        size = padded_size(n, self.sizes)
        if size == n or n == 0:
            return self.inner.run(key, items, flight)
        padded = [*items, *(items[-1] for _ in range(size - n))]
        result = self.inner.run(key, padded, _PaddedFlight.around(flight, n, size))
        return self._real(result, items, size)

    def _real(self, result: Outcome | Paused, items: Sequence[Item], size: int) -> Outcome | Paused:
        n = len(items)
        if isinstance(result, Paused):
            inner = result

            def resume(later: Flight | None) -> Outcome | Paused:
                return self._real(inner.resume(_PaddedFlight.around(later, n, size)), items, size)

            return Paused(result.key, items, result.step, result.steps, resume=resume)
        return Outcome(
            images=result.images[:n],
            errors={i: e for i, e in result.errors.items() if i < n},
            dropped={i: s for i, s in result.dropped.items() if i < n},
        )


class _PaddedFlight(Flight):
    """The batcher's flight as the padded batch sees it: the padding rows are dropped with
    the last real row, so a batch nobody waits for stops."""

    def __init__(self, outer: Flight, real: int, size: int) -> None:
        super().__init__()
        self.outer = outer
        self.real = real
        self.padding = frozenset(range(real, size))

    @classmethod
    def around(cls, flight: Flight | None, real: int, size: int) -> Flight | None:
        return None if flight is None else cls(flight, real, size)

    def poll(self) -> tuple[frozenset[int], bool]:
        dropped, pause = self.outer.poll()
        if len(dropped & frozenset(range(self.real))) == self.real:
            dropped = dropped | self.padding
        return dropped, pause
