"""Recipe pools in the running service: background pre-generation and sampling.

:class:`PoolManager` is the batcher's :class:`~genaug.service.batching.items.IdleSource`. When no
request waits, the batcher asks it for one batch (in a worker thread): it reads every label's
stored and in-flight counts and shared targets from the pool in one snapshot, picks the label
that most needs images (the emptiest, weighted by recent demand; see
:func:`~genaug.service.pool.store.choose_label`), and *reserves* the batch in the pool
(:meth:`~genaug.service.pool.store.PoolStore.reserve`: plan indices and a leased count of images in
flight, granted only while the label is below its target). The batcher's store thread stores
the outcome with :meth:`~genaug.service.pool.store.PoolStore.add`, which deletes the reservation in
the same transaction, while the worker makes the next batch. So a planned image is always
counted once, stored or in flight, by every replica sharing the pool: generated equals target.
When every pool is at its target the answer is ``None`` and the worker sleeps until something
changes (a sample that found too few images, a fill target raised): it never spins.

Targets. A label's target is the larger of this process's own (the pool capacity when
``pregenerate`` is on; what ``genaug pregenerate`` asks in process) and the shared one in the
database (raised by ``POST /v1/recipes/{name}/fill`` and by samples that wait), capped at the
capacity, and for a label of real images at ``images x variants_per_image``.

Variants. A label with ``images: <folder>`` is filled with img2img variants of the folder's
images (read under ``GENAUG_DATA_ROOT`` once, at the recipe's generation size): plan index k
takes source ``k mod len(images)`` and the k-th seed, and the pool keeps each variant's source
hash.

Outages. When the pool database is unreachable, pre-generation pauses (``None``, and the
batcher is woken again after a back-off), finished batches are kept in memory and stored once
the database is back, samples answer 503 with ``Retry-After``, and generation requests are
unaffected.

A request waits for at most one pre-generation batch: the batcher runs one idle batch at a time
and checks its queue between them.

Example::

    manager = PoolManager(recipes, store, model_hash="ab12...-float32", pregenerate=True)
    batcher = Batcher(worker, ..., idle_source=manager)
    manager.attach(batcher)
    sample, recipe = await manager.sample("wound-phases", ["I", "P"], n=64, wait_s=2.0)
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..batching.items import GroupKey, IdleWork, Item, Outcome
from ..errors import InvalidRequestError, NotFoundError, PoolUnavailableError
from ..recipes.spec import Recipe, SourceImage, load_label_sources, pool_id, sources_digest
from .store import (
    LabelStats,
    PoolConnectionError,
    PoolError,
    PoolSample,
    PoolStore,
    Reservation,
    choose_label,
)

if TYPE_CHECKING:
    from ..batching.batcher import Batcher
    from ..pipeline.load import LoadedModel

log = logging.getLogger(__name__)

_DEMAND_HALF_LIFE_S = 60.0
_RATE_WINDOW_S = 60.0
_RETRY_AFTER_S = 2
_MAX_BACKOFF_S = 10.0
_MAX_UNSAVED_BATCHES = 16
_SHARED_POLL_S = 1.0
# Pixels a sample may read on the event loop: 64 images of 64x64 RGB, about 2 ms; larger
# samples (or one 1024x1024 image) go to a thread.
_SAMPLE_NOW_MAX_BYTES = 64 * 64 * 64 * 3


@dataclass
class _Demand:
    """Images asked for per label, decaying with a one-minute half-life."""

    value: float = 0.0
    at: float = 0.0

    def add(self, amount: float, now: float) -> None:
        self.value = self.current(now) + amount
        self.at = now

    def current(self, now: float) -> float:
        if self.value == 0.0:
            return 0.0
        decay: float = 0.5 ** ((now - self.at) / _DEMAND_HALF_LIFE_S)
        return self.value * decay


@dataclass
class _Unsaved:
    """A finished batch the pool could not store yet (an outage): stored when it is back."""

    pool_id: str
    label: str
    images: np.ndarray
    seeds: list[int]
    reservation: Reservation
    indices: list[int]
    sources: list[str | None] | None
    meta: dict[str, Any]


class PoolManager:
    """Keeps the recipes' pools filled and serves samples from them.

    ``data_root`` is where label image folders are read from (``GENAUG_DATA_ROOT``); they are
    read here, once (construct it in a thread when recipes have image folders).
    """

    def __init__(
        self,
        recipes: dict[str, Recipe],
        store: PoolStore,
        *,
        model_hash: str,
        pregenerate: bool,
        data_root: Path | None = None,
    ) -> None:
        self.recipes = recipes
        self.store = store
        self.model_hash = model_hash
        self.sources: dict[str, dict[str, list[SourceImage]]] = {
            name: {label: load_label_sources(r, label, data_root) for label in r.label_names}
            for name, r in recipes.items()
        }
        self.pool_ids = {
            name: pool_id(r, model_hash, sources=sources_digest(self.sources[name]))
            for name, r in recipes.items()
        }
        # This process's own target per recipe and label: capacity when pre-generating, else
        # raised in process (`genaug pregenerate`). Shared targets live in the pool.
        start = store.capacity_per_label if pregenerate else 0
        self._targets = {name: dict.fromkeys(r.label_names, start) for name, r in recipes.items()}
        self._demand: dict[tuple[str, str], _Demand] = {}
        self._added: dict[str, deque[tuple[float, int]]] = {name: deque() for name in recipes}
        self._last_stats: dict[str, dict[str, LabelStats]] = {}
        self._unsaved: deque[_Unsaved] = deque()
        self._lock = threading.Lock()
        self._batcher: Batcher | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._new_images: asyncio.Event | None = None
        self._backoff_s = 0.0
        #: True while pre-generation waits for the pool database to come back.
        self.paused = False
        #: Test hook: called between reading a label's counts and reserving its batch.
        self.before_reserve: Callable[[str, str], None] | None = None

    def attach(self, batcher: Batcher) -> None:
        """Called once the batcher exists, on the event loop: sampling wakes it when a pool
        runs short."""
        self._batcher = batcher
        self._loop = asyncio.get_running_loop()
        self._new_images = asyncio.Event()

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

    def target(self, name: str, label: str, shared: int = 0) -> int:
        """The fill ``label`` of recipe ``name`` is generated up to (see the module doc)."""
        target = min(max(self._targets[name][label], shared), self.store.capacity_per_label)
        spec = self.recipes[name].labels[label]
        if spec.images is not None:
            target = min(target, len(self.sources[name][label]) * spec.variants_per_image)
        return target

    # -- IdleSource --------------------------------------------------------------------------

    def next_idle_batch(self, max_images: int) -> IdleWork | None:
        """The batch that most helps the pools now, or ``None`` when all are at target (or
        the pool database is unreachable: then the batcher is woken again after a back-off).

        Runs in a worker thread; every pool read and the reservation happen here."""
        try:
            self._store_unsaved()
            work = self._plan(max_images)
        except PoolConnectionError as exc:
            self._pause(exc)
            return None
        if self.paused:
            log.warning("pool database reachable again: pre-generation resumes")
        self.paused = False
        self._backoff_s = 0.0
        if work is None and self.store.shared:
            # Other replicas raise shared targets and free expired reservations: look again
            # in a while (one cheap read per recipe), as no local event will wake us.
            self._poke(delay=_SHARED_POLL_S)
        return work

    def _plan(self, max_images: int) -> IdleWork | None:
        now = time.monotonic()
        candidates: list[tuple[float, str, str, int]] = []
        for name, recipe in self.recipes.items():
            stats = self.store.stats(self.pool_ids[name], recipe.label_names)
            self._last_stats[name] = stats
            targets = {label: self.target(name, label, s.target) for label, s in stats.items()}
            if not any(targets.values()):
                continue
            # Stored and in flight, every replica's, read in one snapshot.
            planned = {label: replace(s, fill=s.fill + s.reserved) for label, s in stats.items()}
            with self._lock:
                demand = {
                    label: self._demand.get((name, label), _Demand()).current(now)
                    for label in recipe.label_names
                }
            while True:
                label = choose_label(planned, targets, demand)
                if label is None:
                    break
                room = 1.0 - planned[label].fill / targets[label]
                candidates.append((room, name, label, targets[label] - planned[label].fill))
                planned[label] = replace(planned[label], fill=targets[label])  # next best
        # Most room first; the reservation re-checks under the label's lock and may refuse.
        candidates.sort(key=lambda c: -c[0])
        for _, name, label, missing in candidates:
            if self.before_reserve is not None:
                self.before_reserve(name, label)
            shared = self._last_stats[name][label].target
            count = max(1, min(max_images, missing))
            reservation = self.store.reserve(
                self.pool_ids[name], label, count, target=self.target(name, label, shared)
            )
            if reservation is not None:
                return self._work(name, label, reservation)
        return None

    def _work(self, name: str, label: str, reservation: Reservation) -> IdleWork:
        recipe = self.recipes[name]
        pid = self.pool_ids[name]
        spec = recipe.labels[label]
        sources = self.sources[name][label]
        adapter = recipe.adapter_for(label)
        indices = reservation.indices
        out_h, out_w = recipe.output_size
        key = GroupKey(
            height=recipe.height,
            width=recipe.width,
            steps=recipe.steps,
            scheduler=recipe.scheduler,
            adapter=adapter.name if adapter is not None else None,
            adapter_scale=adapter.scale if adapter is not None else 1.0,
            mode="img2img" if sources else "text",
            strength=spec.strength if sources else 1.0,
        )
        items = []
        for index in indices:
            plan = recipe.plan(label, index)
            source = sources[index % len(sources)] if sources else None
            items.append(Item(
                plan.prompt,
                seed=plan.seed,
                guidance=recipe.guidance,
                output_height=out_h,
                output_width=out_w,
                negative_prompt=plan.negative_prompt,
                channels=recipe.output_channels,
                source=source.pixels if source is not None else None,
                source_hash=source.hash if source is not None else None,
            ))
        meta: dict[str, Any] = {
            "scheduler": key.scheduler,
            "adapter": key.adapter,
            "adapter_scale": key.adapter_scale if key.adapter is not None else None,
        }

        def on_done(outcome: Outcome) -> None:
            ok = outcome.good()
            if outcome.errors:
                log.warning("pre-generation: %d of %d images of %s/%s failed: %s",
                            len(outcome.errors), len(items), name, label,
                            next(iter(outcome.errors.values())))
            batch = _Unsaved(
                pid, label,
                stack_images([outcome.images[i] for i in ok], out_h, out_w,
                             recipe.output_channels),
                [items[i].seed for i in ok], reservation, [indices[i] for i in ok],
                [items[i].source_hash for i in ok] if sources else None, meta,
            )
            try:
                self._save(batch)
            except PoolConnectionError as exc:
                self._keep_unsaved(batch, exc)
                return
            self._images_added(name, len(ok))

        def on_failed(exc: BaseException) -> None:
            try:
                self.store.release(reservation)
            except PoolError as error:  # it expires by itself
                log.warning("could not release the reservation of a failed batch: %s", error)

        return IdleWork(key=key, items=items, on_done=on_done, on_failed=on_failed)

    def _save(self, batch: _Unsaved) -> None:
        self.store.add(
            batch.pool_id, batch.label, batch.images, batch.seeds, model_hash=self.model_hash,
            reservation=batch.reservation, plan_indices=batch.indices, sources=batch.sources,
            **batch.meta,
        )

    def _keep_unsaved(self, batch: _Unsaved, exc: BaseException) -> None:
        with self._lock:
            self._unsaved.append(batch)
            dropped = None
            if len(self._unsaved) > _MAX_UNSAVED_BATCHES:
                dropped = self._unsaved.popleft()
        log.warning("pool database unreachable; keeping a batch of %d images to store later "
                    "(%s)", len(batch.seeds), exc)
        if dropped is not None:
            log.error("dropping %d unstored pre-generated images (more than %d batches wait "
                      "for the database)", len(dropped.seeds), _MAX_UNSAVED_BATCHES)
        self._pause(exc)

    def _store_unsaved(self) -> None:
        """Store batches kept during an outage (in order); raises while it lasts."""
        while True:
            with self._lock:
                if not self._unsaved:
                    return
                batch = self._unsaved[0]
            self._save(batch)
            with self._lock:
                self._unsaved.popleft()
            name = next(n for n, p in self.pool_ids.items() if p == batch.pool_id)
            log.info("stored %d images kept during the database outage", len(batch.seeds))
            self._images_added(name, len(batch.seeds))

    @property
    def unsaved_images(self) -> int:
        """Images made during an outage and not stored yet."""
        with self._lock:
            return sum(len(b.seeds) for b in self._unsaved)

    def _pause(self, exc: BaseException) -> None:
        if not self.paused:
            log.warning("pre-generation paused: %s", exc)
        self.paused = True
        self._backoff_s = min(_MAX_BACKOFF_S, max(0.5, self._backoff_s * 2))
        self._poke(delay=self._backoff_s)

    def _images_added(self, name: str, count: int) -> None:
        """Store thread: note the rate and wake samplers waiting for images."""
        with self._lock:
            added = self._added[name]
            now = time.monotonic()
            added.append((now, count))
            while added and added[0][0] < now - _RATE_WINDOW_S:
                added.popleft()
        if self._loop is not None and self._new_images is not None:
            self._loop.call_soon_threadsafe(self._new_images.set)

    # -- requests ----------------------------------------------------------------------------

    def raise_target(self, name: str, per_label: int, *, shared: bool = True) -> None:
        """Fill ``name``'s labels to at least ``per_label`` images. ``shared`` records the
        target in the pool for every replica (``/fill``); in-process ``genaug pregenerate``
        keeps it to itself. Blocking with ``shared``: call it from a thread."""
        self.recipe(name)
        capacity = self.store.capacity_per_label
        if per_label > capacity:
            raise InvalidRequestError(
                f"per_label {per_label} exceeds the pool capacity per label {capacity}; ask "
                "for fewer or set GENAUG_POOL_CAPACITY_PER_LABEL",
                field="per_label",
            )
        targets = self._targets[name]
        if shared:
            with _unavailable():
                self.store.set_target(self.pool_ids[name], list(targets), per_label)
        else:
            for label in targets:
                targets[label] = max(targets[label], per_label)
        self._poke()

    def _poke(self, delay: float = 0.0) -> None:
        """Wake the batcher (from any thread), now or after ``delay`` seconds."""
        batcher, loop = self._batcher, self._loop
        if batcher is None or loop is None or loop.is_closed():
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if delay > 0:
            loop.call_soon_threadsafe(loop.call_later, delay, batcher.poke)
        elif on_loop:
            batcher.poke()
        else:
            loop.call_soon_threadsafe(batcher.poke)

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
        with self._lock:
            for label in labels:
                self._demand.setdefault((name, label), _Demand()).add(share, now)
        with _unavailable():
            if wait_s > 0 and n > 0:
                await self._wait_for(name, pid, labels, share, now + wait_s)
            # Small samples from a local pool are answered on the loop when no writer holds
            # the lock: the hop to a thread costs more than the read (bench/pool_latency.py).
            height, width = recipe.output_size
            small = n * height * width * recipe.output_channels <= _SAMPLE_NOW_MAX_BYTES
            sample = self.store.sample_now(pid, labels, n) if small else None
            if sample is None:
                sample = await asyncio.to_thread(self.store.sample, pid, labels, n)
        return sample, recipe

    async def _wait_for(
        self, name: str, pid: str, labels: list[str], share: int, deadline: float
    ) -> None:
        raised = False
        while True:
            fill = await asyncio.to_thread(self.store.fill, pid)
            short = [label for label in labels if fill.get(label, 0) < share]
            remaining = deadline - time.monotonic()
            if not short or remaining <= 0:
                return
            if not raised:  # pools grow to what is asked for, for every replica
                want = min(share, self.store.capacity_per_label)
                await asyncio.to_thread(self.store.set_target, pid, short, want)
                raised = True
            assert self._new_images is not None, "attach() the batcher first"
            self._new_images.clear()
            self._poke()
            try:
                await asyncio.wait_for(self._new_images.wait(), timeout=min(remaining, 1.0))
            except TimeoutError:
                pass  # another replica may have added images: look again

    # -- reports -----------------------------------------------------------------------------

    def generation_rate(self, name: str) -> float:
        """Images per second added to ``name``'s pool by this replica over the last minute."""
        now = time.monotonic()
        with self._lock:
            recent = [(t, c) for t, c in self._added[name] if t >= now - _RATE_WINDOW_S]
        if not recent:
            return 0.0
        span = max(now - recent[0][0], 1.0)
        return sum(c for _, c in recent) / span

    def _stats(self, name: str, *, stale_ok: bool) -> dict[str, LabelStats]:
        recipe = self.recipe(name)
        try:
            stats = self.store.stats(self.pool_ids[name], recipe.label_names)
        except PoolConnectionError:
            if stale_ok:  # the status page stays up through an outage, with the last counts
                return self._last_stats.get(name) or {label: LabelStats()
                                                      for label in recipe.label_names}
            raise
        self._last_stats[name] = stats
        return stats

    def summary(self, name: str, *, stats: dict[str, LabelStats] | None = None) -> dict[str, Any]:
        """Name, labels, pool id, capacity, targets and fill (the last known fill while the
        pool database is unreachable). Blocking: call it from a thread."""
        recipe = self.recipe(name)
        stats = stats if stats is not None else self._stats(name, stale_ok=True)
        return {
            "name": name,
            "description": recipe.description,
            "labels": recipe.label_names,
            "pool_id": self.pool_ids[name],
            "capacity_per_label": self.store.capacity_per_label,
            "target_per_label": {label: self.target(name, label, s.target)
                                 for label, s in stats.items()},
            "fill": {label: s.fill for label, s in stats.items()},
        }

    def detail(self, name: str) -> dict[str, Any]:
        """:meth:`summary` plus spec, counts per label and rate; 503 during an outage."""
        recipe = self.recipe(name)
        with _unavailable():
            stats = self._stats(name, stale_ok=False)
        return {
            **self.summary(name, stats=stats),
            "spec": recipe.spec(),
            "spec_hash": recipe.spec_hash(),
            "model_hash": self.model_hash,
            "per_label": {label: s.as_dict() for label, s in stats.items()},
            "totals": {
                "fill": sum(s.fill for s in stats.values()),
                "generated": sum(s.generated for s in stats.values()),
                "served": sum(s.served for s in stats.values()),
            },
            "generation_rate": round(self.generation_rate(name), 3),
        }


class _unavailable:  # noqa: N801 - used as `with _unavailable():`
    """Turn a pool outage into the API's 503 with Retry-After."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, PoolConnectionError):
            raise PoolUnavailableError(
                f"{exc}; pre-generated images are unavailable for now, /v1/generate still "
                f"works; retry after {_RETRY_AFTER_S} s",
                headers={"Retry-After": str(_RETRY_AFTER_S)},
            ) from exc


def unknown_recipe(name: str, recipes: dict[str, Recipe]) -> NotFoundError:
    known = ", ".join(sorted(recipes)) or "none (set GENAUG_RECIPES)"
    return NotFoundError(f"no recipe named {name[:80]!r}; this service has: {known}")


def pool_model_hash(model: LoadedModel) -> str:
    """The model identity pools are keyed on: weights and dtype (images differ across both)."""
    return f"{model.weights_hash}-{str(model.dtype).removeprefix('torch.')}"


def empty_images(recipe: Recipe) -> np.ndarray:
    h, w = recipe.output_size
    return np.zeros((0, h, w, recipe.output_channels), np.uint8)


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
