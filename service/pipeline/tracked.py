"""The hot-path wrapper of the batcher's worker while compilation is on.

With ``GENAUG_COMPILE`` set, the lifespan wraps the :class:`PipelineWorker` in a
:class:`TrackedWorker` (:meth:`~genaug.service.pipeline.speed.Speed.wrap`): every batch reports
its shape to the :class:`~genaug.service.pipeline.warmup.ShapeTracker` before it runs, so a
batch of a shape not compiled at warm-up is counted as a recompile. With compilation off the
worker is not wrapped at all.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..batching.items import Flight, GroupKey, Item, Outcome, Paused, Worker
from .warmup import ShapeTracker

__all__ = ["TrackedWorker"]


class TrackedWorker:
    """A :class:`Worker` that reports each batch's shape, then runs it.

    Example::

        worker = TrackedWorker(generator, tracker)
        worker.run(key, items)   # tracker.observe(key, len(items)); generator.run(key, items)
    """

    def __init__(self, inner: Worker, tracker: ShapeTracker) -> None:
        self.inner = inner
        self.tracker = tracker

    def run(
        self, key: GroupKey, items: Sequence[Item], flight: Flight | None = None
    ) -> Outcome | Paused:
        self.tracker.observe(key, len(items))
        return self.inner.run(key, items, flight)
