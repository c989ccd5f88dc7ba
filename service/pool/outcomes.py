"""A finished pool batch's outcome: the judge's call, storing it, and the outage buffer.

The one place that handles what a pre-generated batch came to. :meth:`BatchOutcomes.handlers`
makes an idle batch's ``on_done`` and ``on_failed``
(:class:`~genaug.service.batching.items.IdleWork`).

On which thread, and why. ``on_done`` runs on the batcher's one **store thread**
(``Batcher._store_executor``, ``genaug-store``), while the worker thread already runs the next
batch's UNet. The judge (:class:`~genaug.service.judge.Judge`, built at start-up on the
generator's device) scores the batch there, right after decoding and before storing, on the
same device as the UNet: an image encoder is small beside a UNet, so it fits beside it, and
scoring in the store thread keeps the worker generating instead of waiting on the judge,
stores each image with its ``scores`` and ``keep`` flags (score >= ``min_score``) in the same
transaction as its reservation's release, and keeps batches stored in the order they were
made (the store executor has one thread). The pool stores a rejected image, counts it and
never samples it; targets count accepted images, so a label is generated until enough images
pass. Images stored before the recipe had a judge keep no score: they are left unjudged and
sampled as before (drop the pool with ``genaug pool drop`` to have every image judged). A
judge that cannot score drops the batch (its reservation is released): it never lets images
through unjudged.

Outages. When the pool database is unreachable, finished batches are kept in memory (at most
:data:`MAX_UNSAVED_BATCHES`; the oldest is dropped past that, logged) and stored, in order,
once the database is back (:meth:`BatchOutcomes.store_unsaved`, called by the planner before
it plans).

Example::

    outcomes = BatchOutcomes(store, model_hash="m", judges={}, added=..., outage=...,
                             rejected=...)
    on_done, on_failed = outcomes.handlers("shapes", pid, "circle", items, reservation,
                                           made=BatchMade(...), size=(64, 64), channels=3,
                                           sources=False)
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..batching.items import Item, Outcome
from .store import PoolStore
from .types import BatchMade, PoolConnectionError, PoolError, Reservation

if TYPE_CHECKING:
    from ..judge import Judge

log = logging.getLogger(__name__)

#: Batches kept in memory through an outage before the oldest is dropped.
MAX_UNSAVED_BATCHES = 16


@dataclass
class UnsavedBatch:
    """A finished batch the pool could not store yet (an outage): stored when it is back."""

    recipe: str
    pool_id: str
    label: str
    images: np.ndarray
    seeds: list[int]
    reservation: Reservation
    indices: list[int]
    sources: list[str | None] | None
    made: BatchMade
    scores: np.ndarray | None = None
    keep: np.ndarray | None = None
    embedding_sum: list[float] | None = None


class BatchOutcomes:
    """Judges and stores finished pool batches; keeps them through a pool outage.

    ``added(name, count)``: images were stored (store thread); ``outage(exc)``: the pool is
    unreachable (pause pre-generation); ``rejected()``: the judge rejected images, so the
    label is below its target with nothing in flight (wake the batcher)."""

    def __init__(
        self,
        store: PoolStore,
        *,
        model_hash: str,
        judges: Mapping[str, Judge],
        added: Callable[[str, int], None],
        outage: Callable[[BaseException], None],
        rejected: Callable[[], None],
    ) -> None:
        self.store = store
        self.model_hash = model_hash
        self.judges = judges
        self._added = added
        self._outage = outage
        self._rejected = rejected
        self._unsaved: deque[UnsavedBatch] = deque()
        self._lock = threading.Lock()

    def handlers(
        self, name: str, pid: str, label: str, items: Sequence[Item], reservation: Reservation,
        *, made: BatchMade, size: tuple[int, int], channels: int, sources: bool,
    ) -> tuple[Callable[[Outcome], None], Callable[[BaseException], None]]:
        """``on_done`` and ``on_failed`` of the idle batch of ``items`` (plan indices
        ``reservation.indices``) for ``label`` of recipe ``name`` (pool ``pid``)."""
        indices = reservation.indices
        judge = self.judges.get(name)
        out_h, out_w = size

        def on_done(outcome: Outcome) -> None:
            # The store thread (module doc): the judge runs here, beside the next batch's UNet.
            ok = outcome.good()
            if outcome.errors:
                log.warning("pre-generation: %d of %d images of %s/%s failed: %s",
                            len(outcome.errors), len(items), name, label,
                            next(iter(outcome.errors.values())))
            images = stack_images([outcome.images[i] for i in ok], out_h, out_w, channels)
            scores = keep = None
            embedding_sum: list[float] | None = None
            if judge is not None:
                try:
                    scores, unit = judge.score_and_embed(images, label)
                    embedding_sum = [float(v) for v in unit.sum(axis=0)] if len(unit) else None
                except Exception:  # a judge that cannot score must not let images through
                    log.exception("the judge of recipe %r could not score a batch of %s; "
                                  "the batch is dropped", name, label)
                    on_failed(RuntimeError("judge failed"))
                    return
                keep = judge.keep(scores)
            batch = UnsavedBatch(
                name, pid, label, images,
                [items[i].seed for i in ok], reservation, [indices[i] for i in ok],
                [items[i].source_hash for i in ok] if sources else None, made, scores, keep,
                embedding_sum,
            )
            try:
                self._save(batch)
            except PoolConnectionError as exc:
                self._keep_unsaved(batch, exc)
                return
            self._added(name, len(ok))
            if keep is not None and not keep.all():
                # Rejected images leave the label below its target although nothing is in
                # flight for it now: the batcher may sleep, thinking the pools are full.
                self._rejected()

        def on_failed(exc: BaseException) -> None:
            try:
                self.store.release(reservation)
            except PoolError as error:  # it expires by itself
                log.warning("could not release the reservation of a failed batch: %s", error)

        return on_done, on_failed

    def _save(self, batch: UnsavedBatch) -> None:
        self.store.add(
            batch.pool_id, batch.label, batch.images, batch.seeds, model_hash=self.model_hash,
            reservation=batch.reservation, plan_indices=batch.indices, sources=batch.sources,
            scores=None if batch.scores is None else [float(v) for v in batch.scores],
            keep=None if batch.keep is None else [bool(v) for v in batch.keep],
            embedding_sum=batch.embedding_sum, scheduler=batch.made.scheduler,
            adapter=batch.made.adapter, adapter_scale=batch.made.adapter_scale,
            provenance=batch.made.provenance,
        )

    def _keep_unsaved(self, batch: UnsavedBatch, exc: BaseException) -> None:
        with self._lock:
            self._unsaved.append(batch)
            dropped = None
            if len(self._unsaved) > MAX_UNSAVED_BATCHES:
                dropped = self._unsaved.popleft()
        log.warning("pool database unreachable; keeping a batch of %d images to store later "
                    "(%s)", len(batch.seeds), exc)
        if dropped is not None:
            log.error("dropping %d unstored pre-generated images (more than %d batches wait "
                      "for the database)", len(dropped.seeds), MAX_UNSAVED_BATCHES)
        self._outage(exc)

    def store_unsaved(self) -> None:
        """Store batches kept during an outage (in order); raises while it lasts."""
        while True:
            with self._lock:
                if not self._unsaved:
                    return
                batch = self._unsaved[0]
            self._save(batch)
            with self._lock:
                self._unsaved.popleft()
            log.info("stored %d images kept during the database outage", len(batch.seeds))
            self._added(batch.recipe, len(batch.seeds))

    @property
    def unsaved_images(self) -> int:
        """Images made during an outage and not stored yet."""
        with self._lock:
            return sum(len(b.seeds) for b in self._unsaved)


def stack_images(
    images: list[np.ndarray], height: int, width: int, channels: int = 3
) -> np.ndarray:
    """``images`` as one uint8 ``[n, height, width, channels]`` array (also when empty)."""
    if not images:
        return np.zeros((0, height, width, channels), np.uint8)
    out = np.stack(images)
    if out.ndim == 3:  # [n, h, w] luminance from a worker that drops the channel axis
        out = out[..., None]
    return out
