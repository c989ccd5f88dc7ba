"""The recipes' pools as the routes see them: sample (waiting for fill), fill, summaries.

:class:`PoolServing` is the one object the app and the routes use for pools
(``AppState.pools``). It holds the :class:`~genaug.service.pool.planner.PoolPlanner` (the
idle-time pre-generation the batcher asks for work) and its store, and adds what a request
needs:

- ``sample``: up to ``n`` images spread over labels, read on the event loop when small and
  local, else in a thread; with ``wait_s`` it raises the labels' shared targets, wakes the
  planner and waits (up to ``wait_s``) for each label to hold its share. It never waits for
  a label the judge stopped (the low-acceptance stop: no more images of it are made), and
  returns as soon as every label it still waits for is stopped or holds its share;
  ``stopped`` names those labels with the judge's reason and fix, for the answer. Each sample
  is demand the planner weighs labels by.
- ``report_need`` (``/feedback``), ``summary`` (the list and the status page, with the
  trainers' combined need) and ``detail``. A fill is a job: :mod:`genaug.service.jobs`.
- Curation: ``verdict`` (a person's reject or restore, ``/verdicts``), ``browse`` and
  ``image`` (what the pool page shows, ``/images``).
- :meth:`PoolServing.attach`, once the batcher runs, on the event loop: the app passes the
  batcher's ``poke`` as ``wake``; this side makes it callable from any thread (and after a
  delay) for the planner, and wakes waiting samples when the planner stores images. Neither
  the planner nor this module holds the batcher.

Outages. While the pool database is unreachable, samples, fills and ``detail`` answer 503
with ``Retry-After`` (:class:`~genaug.service.errors.PoolUnavailableError`), the summary
shows the last known counts, and generation requests are unaffected.

Example::

    pools = PoolServing(PoolPlanner(recipes, store, model_hash="ab12...-float32",
                                    pregenerate=True))
    batcher.idle_source = pools.planner
    pools.attach(wake=batcher.poke)
    sample, recipe = await pools.sample("wound-phases", ["I", "P"], n=64, wait_s=2.0)
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..batching.queue import trainer_of
from ..errors import InvalidRequestError, NotFoundError, PoolUnavailableError
from ..recipes.spec import Recipe
from .planner import PoolPlanner
from .types import BrowsePage, LabelStats, PoolConnectionError, PoolSample

__all__ = ["PoolServing", "empty_images", "unavailable", "unknown_recipe"]

_RETRY_AFTER_S = 2
# Pixels a sample may read on the event loop: 64 images of 64x64 RGB, about 2 ms; larger
# samples (or one 1024x1024 image) go to a thread.
_SAMPLE_NOW_MAX_BYTES = 64 * 64 * 64 * 3


class PoolServing:
    """Serves samples, fills and reports from the pools its planner keeps filled.

    ``pool_ids``, ``recipes`` and ``store`` are the planner's.
    """

    def __init__(self, planner: PoolPlanner) -> None:
        self.planner = planner
        self.store = planner.store
        self.recipes = planner.recipes
        self.pool_ids = planner.pool_ids
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: Callable[[], None] | None = None
        self._new_images: asyncio.Event | None = None

    def attach(self, *, wake: Callable[[], None]) -> None:
        """Called once the batcher exists, on the event loop: ``wake`` (called on the loop)
        asks the batcher for idle work; the planner calls it when work appears and sampling
        when a pool runs short."""
        self._loop = asyncio.get_running_loop()
        self._wake = wake
        self._new_images = asyncio.Event()
        self.planner.connect(wake=self._wake_soon, stored=self._images_stored)

    def _wake_soon(self, delay: float = 0.0) -> None:
        """Call ``wake`` on the loop (from any thread), now or after ``delay`` seconds."""
        wake, loop = self._wake, self._loop
        if wake is None or loop is None or loop.is_closed():
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if delay > 0:
            loop.call_soon_threadsafe(loop.call_later, delay, wake)
        elif on_loop:
            wake()
        else:
            loop.call_soon_threadsafe(wake)

    def _images_stored(self) -> None:
        """Store thread: wake samples waiting for images."""
        if self._loop is not None and self._new_images is not None:
            self._loop.call_soon_threadsafe(self._new_images.set)

    # -- lookups ---------------------------------------------------------------------------

    def recipe(self, name: str) -> Recipe:
        recipe = self.recipes.get(name)
        if recipe is None:
            raise unknown_recipe(name, self.recipes)
        return recipe

    def resolve_labels(self, recipe: Recipe, labels: str | Sequence[str] | None) -> list[str]:
        if labels is None:
            return recipe.label_names
        wanted = [labels] if isinstance(labels, str) else list(labels)
        unknown = [label for label in wanted if label not in recipe.labels]
        if unknown or not wanted:
            raise InvalidRequestError(
                f"labels {wanted!r}: recipe {recipe.name!r} has no label "
                f"{', '.join(map(repr, unknown)) or '(empty list)'}; use some of "
                f"{recipe.label_names} or leave labels out for all",
                field="labels",
            )
        return list(dict.fromkeys(wanted))

    # -- requests ----------------------------------------------------------------------------

    def report_need(self, name: str, client: str, need: dict[str, float]) -> dict[str, Any]:
        """Record the need of ``client``'s trainer for ``name`` (validated labels, values
        >= 0) and answer the combination the planner now uses (see
        :mod:`~genaug.service.pool.need`). A trainer's ranks and DataLoader workers
        (``trainer-a/r0/w1``) report as that one trainer (:func:`trainer_of`)."""
        recipe = self.recipe(name)
        trainer = trainer_of(client)
        self.planner.report_need(name, trainer, need)
        return {"recipe": name, "client": trainer, **self._need(name, recipe)}

    def _need(self, name: str, recipe: Recipe) -> dict[str, Any]:
        board = self.planner.need
        combined = board.combined(name, recipe.label_names)
        return {
            "need": {label: round(value, 4) for label, value in combined.items()},
            "need_clients": board.clients(name),
        }

    async def sample(
        self, name: str, labels: list[str], n: int, wait_s: float
    ) -> tuple[PoolSample, Recipe]:
        """Up to ``n`` images over ``labels``; waits up to ``wait_s`` for each label to hold
        its share, generating meanwhile (at bulk priority, when no request waits).

        Raises :class:`~genaug.service.errors.PoolUnavailableError` (503, Retry-After) while
        the pool database is unreachable."""
        recipe = self.recipe(name)
        pid = self.pool_ids[name]
        now = time.monotonic()
        share = math.ceil(n / len(labels)) if labels else 0
        self.planner.add_demand(name, labels, share)
        with unavailable():
            if wait_s > 0 and n > 0:
                await self._wait_for(name, pid, labels, share, now + wait_s)
            # Small samples from a local pool are answered on the loop when no writer holds
            # the lock: the hop to a thread costs more than the read (bench/pool/pool_latency.py).
            height, width = recipe.output_size
            small = n * height * width * recipe.output_channels <= _SAMPLE_NOW_MAX_BYTES
            sample = self.store.sample_now(pid, labels, n) if small else None
            if sample is None:
                sample = await asyncio.to_thread(self.store.sample, pid, labels, n)
        return sample, recipe

    def stopped(self, name: str, labels: Sequence[str]) -> dict[str, str]:
        """The labels of ``labels`` the judge stopped (no more images of them are made), each
        with the judge's reason and fix, as ``GET /v1/recipes/{name}`` reports them. On the
        event loop: the planner's last read of the pool's stops, never the database."""
        stopped = self.planner.stopped(name, cached=True)
        return {label: stopped[label] for label in labels if label in stopped}

    async def _wait_for(self, name: str, pid: str, labels: list[str], share: int,
                        deadline: float) -> None:
        raised = False
        while True:
            fill = await asyncio.to_thread(self.store.fill, pid)
            # A stopped label gets no more images: waiting for it would last the whole wait_s.
            # Read each round, since a label may stop while the sample waits (in a thread:
            # it may read the pool's stops, which any replica records).
            stopped = await asyncio.to_thread(self.planner.stopped, name)
            short = [label for label in labels
                     if fill.get(label, 0) < share and label not in stopped]
            remaining = deadline - time.monotonic()
            if not short or remaining <= 0:
                return
            if not raised:  # pools grow to what is asked for, for every replica
                want = min(share, self.store.capacity_per_label)
                await asyncio.to_thread(self.store.set_target, pid, short, want)
                raised = True
            assert self._new_images is not None, "attach() the batcher first"
            self._new_images.clear()
            self._wake_soon()
            try:
                await asyncio.wait_for(self._new_images.wait(), timeout=min(remaining, 1.0))
            except TimeoutError:
                pass  # another replica may have added images: look again

    # -- curation ----------------------------------------------------------------------------

    def label_of(self, recipe: Recipe, label: str) -> str:
        """``label`` if the recipe has it, else a 422 naming the field, the value and the
        recipe's labels."""
        if label not in recipe.labels:
            raise InvalidRequestError(
                f"label {label[:80]!r}: recipe {recipe.name!r} has no such label; use one of "
                f"{recipe.label_names}", field="label")
        return label

    def verdict(self, name: str, label: str, seeds: Sequence[int], keep: bool) -> dict[str, Any]:
        """A person's verdict on ``label``'s images with ``seeds`` (all or nothing): 404
        naming the unknown seeds, else what changed and the label's counts now. Wakes the
        planner (a reject lowers the fill: a replacement is generated). Blocking: call it
        from a thread; 503 during an outage."""
        recipe = self.recipe(name)
        self.label_of(recipe, label)
        pid = self.pool_ids[name]
        with unavailable():
            result = self.store.curation.verdict(pid, label, seeds, keep=keep)
            if result.unknown:
                shown = ", ".join(map(str, result.unknown[:20]))
                more = f" and {len(result.unknown) - 20} more" if len(result.unknown) > 20 else ""
                raise NotFoundError(
                    f"seeds: label {label!r} of recipe {name!r} has no image with seed(s) "
                    f"{shown}{more}; nothing was applied. Use seeds that samples or "
                    f"GET /v1/recipes/{name}/images?label={label} return (an evicted image is "
                    "gone)", field="seeds")
            stats = self.store.stats(pid, [label])[label]
        if result.changed:
            self._wake_soon()
        return {
            "recipe": name,
            "label": label,
            "keep": keep,
            "changed": result.changed,
            "unchanged": result.unchanged,
            "accepted": stats.accepted,
            "rejected": stats.rejected,
            "rejected_by_person": stats.rejected_by_person,
        }

    def browse(self, name: str, label: str, *, rejected: bool, offset: int,
               limit: int) -> tuple[BrowsePage, LabelStats]:
        """One page of ``label``'s accepted or rejected images and the label's counts.
        Blocking: call it from a thread; 503 during an outage."""
        recipe = self.recipe(name)
        self.label_of(recipe, label)
        pid = self.pool_ids[name]
        with unavailable():
            page = self.store.curation.browse(pid, label, rejected=rejected, offset=offset,
                                              limit=limit)
            stats = self.store.stats(pid, [label])[label]
        return page, stats

    def image(self, name: str, label: str, seed: int) -> np.ndarray:
        """The pixels of ``label``'s image with ``seed`` (404 when there is none). Blocking:
        call it from a thread; 503 during an outage."""
        recipe = self.recipe(name)
        self.label_of(recipe, label)
        with unavailable():
            image = self.store.curation.image(self.pool_ids[name], label, seed)
        if image is None:
            raise NotFoundError(
                f"label {label!r} of recipe {name!r} has no image with seed {seed} (an "
                "evicted image is gone)", field="seed")
        return image

    # -- reports -----------------------------------------------------------------------------

    def _stats(self, name: str, *, stale_ok: bool) -> dict[str, LabelStats]:
        recipe = self.recipe(name)
        try:
            stats = self.store.stats(self.pool_ids[name], recipe.label_names)
        except PoolConnectionError:
            if stale_ok:  # the status page stays up through an outage, with the last counts
                return self.planner.last_stats.get(name) or {
                    label: LabelStats() for label in recipe.label_names}
            raise
        self.planner.last_stats[name] = stats
        return stats

    def summary(self, name: str, *, stats: dict[str, LabelStats] | None = None) -> dict[str, Any]:
        """Name, labels, pool id, capacity, targets, fill (the last known fill while the
        pool database is unreachable) and how the pool is drawn (``sampling``: auto's last
        decision as read). Blocking: call it from a thread."""
        recipe = self.recipe(name)
        stats = stats if stats is not None else self._stats(name, stale_ok=True)
        return {
            "name": name,
            "description": recipe.description,
            "labels": recipe.label_names,
            "pool_id": self.pool_ids[name],
            "capacity_per_label": self.store.capacity_per_label,
            "target_per_label": {label: self.planner.target(name, label, s.target)
                                 for label, s in stats.items()},
            "fill": {label: s.fill for label, s in stats.items()},
            **self._need(name, recipe),
            "sampling": self.planner.samplers.describe(name),
        }

    def detail(self, name: str) -> dict[str, Any]:
        """:meth:`summary` plus spec, counts per label and rate; 503 during an outage."""
        recipe = self.recipe(name)
        with unavailable():
            stats = self._stats(name, stale_ok=False)
        return {
            **self.summary(name, stats=stats),
            "spec": recipe.spec(),
            "spec_hash": recipe.spec_hash(),
            "model_hash": self.planner.model_hash,
            "per_label": {label: _counts(self.planner.asked(name, label, s.target), s)
                          for label, s in stats.items()},
            "totals": {
                "fill": sum(s.fill for s in stats.values()),
                "generated": sum(s.generated for s in stats.values()),
                "served": sum(s.served for s in stats.values()),
            },
            "generation_rate": round(self.planner.generation_rate(name), 3),
        }


def _counts(asked: int, stats: LabelStats) -> dict[str, int]:
    """One label's counts for the detail: ``asked`` replaces the pool's raw shared target,
    so the detail shows one target per label (``target_per_label``)."""
    counts = stats.as_dict()
    del counts["target"]
    counts["asked"] = asked
    return counts


class unavailable:
    """Turn a pool outage into the API's 503 with Retry-After."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, PoolConnectionError):
            raise PoolUnavailableError(
                f"{exc}; pre-generated images are unavailable for now, /v1/generate still "
                f"works; retry after {_RETRY_AFTER_S} s",
                retry_after_s=_RETRY_AFTER_S,
            ) from exc


def unknown_recipe(name: str, recipes: dict[str, Recipe]) -> NotFoundError:
    known = ", ".join(sorted(recipes)) or "none (set GENAUG_RECIPES)"
    return NotFoundError(f"no recipe named {name[:80]!r}; this service has: {known}")


def empty_images(recipe: Recipe) -> np.ndarray:
    h, w = recipe.output_size
    return np.zeros((0, h, w, recipe.output_channels), np.uint8)
