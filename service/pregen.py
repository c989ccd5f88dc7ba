"""Recipe pools in the running service: background pre-generation and sampling.

:class:`PoolManager` is the batcher's :class:`~genaug.service.batcher.IdleSource`. When no
request waits, the batcher asks it for one batch: it picks the recipe label that most needs
images (the emptiest, weighted by recent demand; see :func:`~genaug.service.pool.choose_label`),
plans prompts and seeds from the recipe (reserving the next indices of the pool's plan), and
stores the outcome in the SQLite pool from the batcher's store thread while the worker makes
the next batch. When every pool is at its target the answer is ``None`` and the worker
sleeps until something changes (a sample that found too few images, a fill target raised):
it never spins.

A request waits for at most one such batch: the batcher runs one idle batch at a time and
checks its queue between them.

Example::

    manager = PoolManager(recipes, store, model_hash="ab12...", settings=settings)
    batcher = Batcher(worker, ..., idle_source=manager)
    manager.attach(batcher)
    sample = await manager.sample("wound-phases", ["I", "P"], n=64, wait_s=2.0)
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .batcher import Batcher
from .errors import InvalidRequestError, NotFoundError
from .pool import PoolSample, PoolStore, choose_label
from .recipes import Recipe, pool_id
from .work import GroupKey, IdleWork, Item, Outcome

if TYPE_CHECKING:
    from .model import LoadedModel

log = logging.getLogger(__name__)

_DEMAND_HALF_LIFE_S = 60.0
_RATE_WINDOW_S = 60.0


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


class PoolManager:
    """Keeps the recipes' pools filled and serves samples from them."""

    def __init__(
        self,
        recipes: dict[str, Recipe],
        store: PoolStore,
        *,
        model_hash: str,
        pregenerate: bool,
    ) -> None:
        self.recipes = recipes
        self.store = store
        self.model_hash = model_hash
        self.pool_ids = {name: pool_id(r, model_hash) for name, r in recipes.items()}
        # Target fill per recipe and label: capacity when pre-generating, else raised by
        # samples that wait and by `genaug pregenerate`.
        start = store.capacity_per_label if pregenerate else 0
        self._targets = {name: dict.fromkeys(r.label_names, start) for name, r in recipes.items()}
        self._demand: dict[tuple[str, str], _Demand] = {}
        self._unstored: dict[tuple[str, str], int] = {}  # planned, not yet in the store
        self._added: dict[str, deque[tuple[float, int]]] = {name: deque() for name in recipes}
        self._lock = threading.Lock()
        self._batcher: Batcher | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._new_images: asyncio.Event | None = None

    def attach(self, batcher: Batcher) -> None:
        """Called once the batcher exists: sampling wakes it when a pool runs short."""
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

    # -- IdleSource --------------------------------------------------------------------------

    def next_idle_batch(self, max_images: int) -> IdleWork | None:
        """The batch that most helps the pools now, or ``None`` when all are at target."""
        now = time.monotonic()
        best: tuple[float, str, str, int] | None = None
        for name, recipe in self.recipes.items():
            targets = dict(self._targets[name])
            if not any(targets.values()):
                continue
            stats = self.store.stats(self.pool_ids[name], recipe.label_names)
            with self._lock:
                # Images made but not stored yet count as there (no overshoot past a target).
                stats = {
                    label: replace(s, fill=s.fill + self._unstored.get((name, label), 0))
                    for label, s in stats.items()
                }
                demand = {
                    label: self._demand.get((name, label), _Demand()).current(now)
                    for label in recipe.label_names
                }
            label = choose_label(stats, targets, demand)
            if label is None:
                continue
            room = 1.0 - stats[label].fill / targets[label]
            if best is None or room > best[0]:
                best = (room, name, label, targets[label] - stats[label].fill)
        if best is None:
            return None
        _, name, label, missing = best
        recipe = self.recipes[name]
        pid = self.pool_ids[name]
        count = max(1, min(max_images, missing))
        # Reserved, not read: the previous batch may still be being stored, and a batch lost
        # in a crash leaves a gap in the seed plan, never a repeated seed.
        start = self.store.reserve(pid, label, count)
        with self._lock:
            self._unstored[(name, label)] = self._unstored.get((name, label), 0) + count
        plan = recipe.plan_batch(label, start, count)
        out_h, out_w = recipe.output_size
        key = GroupKey(height=recipe.height, width=recipe.width, steps=recipe.steps)
        items = [
            Item(
                p.prompt,
                seed=p.seed,
                guidance=recipe.guidance,
                output_height=out_h,
                output_width=out_w,
                negative_prompt=p.negative_prompt,
            )
            for p in plan
        ]

        def on_done(outcome: Outcome) -> None:
            ok = outcome.good()
            if outcome.errors:
                log.warning("pre-generation: %d of %d images of %s/%s failed: %s",
                            len(outcome.errors), len(items), name, label,
                            next(iter(outcome.errors.values())))
            try:
                self.store.add(
                    pid, label, stack_images([outcome.images[i] for i in ok], out_h, out_w),
                    [items[i].seed for i in ok], model_hash=self.model_hash,
                )
            finally:
                with self._lock:
                    self._unstored[(name, label)] -= count
            self._images_added(name, len(ok))

        return IdleWork(key=key, items=items, on_done=on_done)

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

    def raise_target(self, name: str, per_label: int) -> None:
        """Fill ``name``'s labels to at least ``per_label`` images (``genaug pregenerate``)."""
        capacity = self.store.capacity_per_label
        if per_label > capacity:
            raise InvalidRequestError(
                f"per_label {per_label} exceeds the pool capacity per label {capacity}; ask "
                "for fewer or set GENAUG_POOL_CAPACITY_PER_LABEL",
                field="per_label",
            )
        targets = self._targets[name]
        for label in targets:
            targets[label] = max(targets[label], per_label)
        self._poke()

    def _poke(self) -> None:
        if self._batcher is not None:
            self._batcher.poke()

    async def sample(
        self, name: str, labels: list[str], n: int, wait_s: float
    ) -> tuple[PoolSample, Recipe]:
        """Up to ``n`` images over ``labels``; waits up to ``wait_s`` for each label to hold
        its share, generating meanwhile (at bulk priority, when no request waits)."""
        recipe = self.recipe(name)
        pid = self.pool_ids[name]
        now = time.monotonic()
        share = math.ceil(n / len(labels)) if labels else 0
        with self._lock:
            for label in labels:
                self._demand.setdefault((name, label), _Demand()).add(share, now)
        if wait_s > 0 and n > 0:
            deadline = now + wait_s
            while True:
                fill = await asyncio.to_thread(self.store.fill, pid)
                short = [label for label in labels if fill.get(label, 0) < share]
                remaining = deadline - time.monotonic()
                if not short or remaining <= 0:
                    break
                # Demand-only pools (pregenerate off) grow to what is asked for.
                targets = self._targets[name]
                for label in short:
                    targets[label] = max(targets[label], min(share, self.store.capacity_per_label))
                assert self._new_images is not None
                self._new_images.clear()
                self._poke()
                try:
                    await asyncio.wait_for(self._new_images.wait(), timeout=remaining)
                except TimeoutError:
                    break
        sample = await asyncio.to_thread(self.store.sample, pid, labels, n)
        return sample, recipe

    # -- reports -----------------------------------------------------------------------------

    def generation_rate(self, name: str) -> float:
        """Images per second added to ``name``'s pool over the last minute."""
        now = time.monotonic()
        with self._lock:
            recent = [(t, c) for t, c in self._added[name] if t >= now - _RATE_WINDOW_S]
        if not recent:
            return 0.0
        span = max(now - recent[0][0], 1.0)
        return sum(c for _, c in recent) / span

    def summary(self, name: str) -> dict[str, Any]:
        recipe = self.recipe(name)
        pid = self.pool_ids[name]
        stats = self.store.stats(pid, recipe.label_names)
        return {
            "name": name,
            "description": recipe.description,
            "labels": recipe.label_names,
            "pool_id": pid,
            "capacity_per_label": self.store.capacity_per_label,
            "target_per_label": dict(self._targets[name]),
            "fill": {label: s.fill for label, s in stats.items()},
        }

    def detail(self, name: str) -> dict[str, Any]:
        recipe = self.recipe(name)
        pid = self.pool_ids[name]
        stats = self.store.stats(pid, recipe.label_names)
        return {
            **self.summary(name),
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


def unknown_recipe(name: str, recipes: dict[str, Recipe]) -> NotFoundError:
    known = ", ".join(sorted(recipes)) or "none (set GENAUG_RECIPES)"
    return NotFoundError(f"no recipe named {name[:80]!r}; this service has: {known}")


def pool_model_hash(model: LoadedModel) -> str:
    """The model identity pools are keyed on: weights and dtype (images differ across both)."""
    return f"{model.weights_hash}-{str(model.dtype).removeprefix('torch.')}"


def empty_images(recipe: Recipe) -> np.ndarray:
    h, w = recipe.output_size
    return np.zeros((0, h, w, 3), np.uint8)


def stack_images(
    images: list[np.ndarray], height: int, width: int, channels: int = 3
) -> np.ndarray:
    """``images`` as one uint8 ``[n, height, width, channels]`` array (also when empty)."""
    if not images:
        return np.zeros((0, height, width, channels), np.uint8)
    return np.stack(images)
