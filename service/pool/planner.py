"""Pre-generation: the idle work that keeps the recipes' pools filled, and its outcomes.

:class:`PoolPlanner` is the batcher's :class:`~genaug.service.batching.items.IdleSource`. When
no request waits, the batcher asks it for one batch (in a worker thread): it reads every
label's stored and in-flight counts and shared targets from the pool in one snapshot, picks
the label that most needs images (the emptiest, weighted by recent demand and by the
trainers' reported need; see :func:`choose_label` and :mod:`~genaug.service.pool.need`), and
*reserves* the batch in the pool
(:meth:`~genaug.service.pool.store.PoolStore.reserve`: plan indices and a leased count of
images in flight, granted only while the label is below its target). The batch's work items
are made by :func:`~genaug.service.intake.plan.plan_pool_batch`. The batcher's store thread
stores the outcome with :meth:`~genaug.service.pool.store.PoolStore.add`, which deletes the
reservation in the same transaction, while the worker makes the next batch. So a planned
image is always counted once, stored or in flight, by every replica sharing the pool:
generated equals target. When every pool is at its target the answer is ``None`` and the
worker sleeps until something changes (a sample that found too few images, a fill target
raised): it never spins.

The planner does not hold the batcher: it is given a ``wake`` callback (``connect``; the app
wires it to the batcher's poke) to call, from any thread, when there is work again, and a
``stored`` callback for samples waiting for images (sampling, waiting, the routes' reports:
:mod:`genaug.service.pool.serving`).

Its parts, each a module of its own: targets and demand
(:mod:`~genaug.service.pool.targets`, pure, given ``now``), which label next
(:mod:`~genaug.service.pool.choice`), the trainers' need (:mod:`~genaug.service.pool.need`),
a batch's outcome, the judge's call and the outage buffer
(:mod:`~genaug.service.pool.outcomes`: it says on which thread the judge runs, and why), and
the low-acceptance stop (:mod:`~genaug.service.pool.acceptance`: a stopped label is no longer
planned or given a fill budget; :meth:`PoolPlanner.stopped` is this replica's stops and every
replica's in the pool: :mod:`~genaug.service.pool.stops`). The planner keeps the planning and
wires them.

Fills. A shared fill is a job of the jobs package (:mod:`genaug.service.jobs`), which stores it
with the shared targets the planner works out for it (:meth:`PoolPlanner.plan_fill`,
:meth:`PoolPlanner.plan_budget`) in one transaction; in-process ``genaug pregenerate`` raises
this planner's own targets (:meth:`PoolPlanner.raise_target`). Each stored image keeps what
made it (:class:`~genaug.service.pool.types.Provenance`: the sampler its recipe's speed chose,
:mod:`~genaug.service.sampling.pools`; steps, guidance, strength, adapter and judge hashes).

Variants. A label with ``images: <folder>`` is filled with img2img variants of its images
(read under ``GENAUG_DATA_ROOT`` once, at the generation size): plan index k takes source
``k mod len(images)`` and the k-th seed; the pool keeps each variant's source hash.

Outages. When the pool database is unreachable, pre-generation pauses (``None``, and the
batcher is woken again after a back-off) and finished batches wait in
:mod:`~genaug.service.pool.outcomes` until the database is back. The batcher runs one idle
batch at a time; an interactive request pauses it at the next denoising step (it resumes
later, keeping its reservation, so no plan index is repeated or skipped).

Example::

    planner = PoolPlanner(recipes, store, model_hash="ab12...-float32", pregenerate=True)
    batcher = Batcher(worker, ..., idle_source=planner)
    planner.connect(wake=lambda delay: ..., stored=lambda: ...)  # PoolServing.attach does it
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..batching.items import IdleWork
from ..errors import InvalidRequestError, PoolFullError
from ..intake.plan import plan_pool_batch
from ..recipes.sources import SourceImage, load_label_sources, sources_digest
from ..recipes.spec import Recipe, pool_id
from ..sampling.modes import Turbo
from ..sampling.pools import PoolSamplers
from .acceptance import AcceptanceStop
from .choice import allocate, choose_label, label_score, label_weight
from .identity import PoolIdentity
from .need import NeedBoard
from .outcomes import BatchOutcomes
from .stops import SharedStops, judge_keys
from .store import PoolStore
from .targets import DemandBoard, asked_fill, fill_target, label_limit
from .types import (
    BatchMade,
    LabelStats,
    PoolConnectionError,
    PoolError,
    Provenance,
    Reservation,
)

if TYPE_CHECKING:
    from ..judge import Judge
    from ..pipeline.load import LoadedModel

log = logging.getLogger(__name__)

_RATE_WINDOW_S = 60.0
_MAX_BACKOFF_S = 10.0
_SHARED_POLL_S = 1.0

#: A planning candidate: (tier, score, recipe, label, missing, target).
Candidate = tuple[int, float, str, str, int, int]


def _no_wake(delay: float = 0.0) -> None:
    """Before :meth:`PoolPlanner.connect`: nobody to wake, nobody waiting for images."""
    return None


class PoolPlanner:
    """Plans the batches that fill the recipes' pools when the generator is idle.

    ``data_root`` is where label image folders are read from (``GENAUG_DATA_ROOT``); they are
    read here, once (construct it in a thread when recipes have image folders). Example::

        planner = PoolPlanner({"shapes": recipe}, store, model_hash="m", pregenerate=False)
        planner.raise_target("shapes", 100, shared=False)
        work = planner.next_idle_batch(8)  # IdleWork: key, items, on_done, on_failed
    """

    def __init__(
        self,
        recipes: dict[str, Recipe],
        store: PoolStore,
        *,
        model_hash: str,
        pregenerate: bool,
        data_root: Path | None = None,
        need_half_life_s: float = 60.0,
        judges: Mapping[str, Judge] | None = None,
        adapter_hashes: Mapping[str, str] | None = None,
        turbo: Turbo | None = None,
        identity: PoolIdentity | None = None,
    ) -> None:
        self.recipes = recipes
        self.store = store
        #: A worker's pools as an api serves them, without the model (``identity``): no label
        #: images are read and nothing is judged; the pools, judge and stop keys are the
        #: worker's.
        self.borrowed = identity is not None
        self.model_hash = identity.model_hash if identity is not None else model_hash
        self.sources: dict[str, dict[str, list[SourceImage]]] = {
            name: {label: ([] if identity is not None
                           else load_label_sources(r, label, data_root))
                   for label in r.label_names}
            for name, r in recipes.items()
        }
        self.pool_ids = dict(identity.pool_ids) if identity is not None else {
            name: pool_id(r, model_hash, sources=sources_digest(self.sources[name]))
            for name, r in recipes.items()
        }
        if identity is None:
            self._record_recipes()
        # Background work fills every label to the capacity when pre-generating; what is
        # asked in process (`genaug pregenerate`) is this process's own; shared asks live in
        # the pool.
        self.pregenerate = pregenerate
        self._targets = {name: dict.fromkeys(r.label_names, 0) for name, r in recipes.items()}
        self._demand = DemandBoard()
        #: What trainers report they need (``POST /v1/recipes/{name}/feedback``).
        self.need = NeedBoard(need_half_life_s)
        self._added: dict[str, deque[tuple[float, int]]] = {name: deque() for name in recipes}
        #: The counts last read per recipe (the status page shows them through an outage).
        self.last_stats: dict[str, dict[str, LabelStats]] = {}
        self._lock = threading.Lock()
        self._wake: Callable[[float], None] = _no_wake
        self._stored: Callable[[], None] = _no_wake
        self._backoff_s = 0.0
        #: True while pre-generation waits for the pool database to come back.
        self.paused = False
        #: Each judged recipe's judge (see :mod:`~genaug.service.pool.outcomes`), by recipe.
        self.judges: dict[str, Judge] = dict(judges or {})
        #: Content hash of each loaded adapter by name (``/v1/info``'s): stored with each
        #: image it made, and part of its labels' stop keys.
        self.adapter_hashes = dict(identity.adapter_hashes if identity is not None
                                   else adapter_hashes or {})
        #: recipe -> (judge key, settings JSON) stored with each image; label stop keys.
        self._judge_made, self._stop_keys = (
            (dict(identity.judges), dict(identity.stop_keys)) if identity is not None
            else judge_keys(recipes, self.judges, data_root, self._adapter_hash))
        self.stops = SharedStops(store, self.pool_ids, self._stop_keys)
        self._acceptance = AcceptanceStop(recipes, record=self.stops.record)
        # The wake callback is read when called: connect() may replace it later.
        self._outcomes = BatchOutcomes(
            store, model_hash=model_hash, judges=self.judges, added=self._images_added,
            outage=self._pause, rejected=lambda: self._wake(0.0))
        #: The sampler each pool is drawn with: its own, turbo, or auto's choice.
        self.samplers = PoolSamplers(
            recipes, store.samplers, self.pool_ids, turbo=turbo, adapter_hash=self._adapter_hash,
            judge_keys={name: key for name, (key, _) in self._judge_made.items()},
            pregenerate=pregenerate, stopped=self.stopped)
        #: Test hook: called between reading a label's counts and reserving its batch.
        self.before_reserve: Callable[[str, str], None] | None = None

    @property
    def identity(self) -> PoolIdentity:
        """These pools' names, as an api that loads no model serves them
        (:mod:`~genaug.service.pool.identity`)."""
        return PoolIdentity(self.model_hash, dict(self.pool_ids), dict(self._judge_made),
                            {k: dict(v) for k, v in self._stop_keys.items()},
                            dict(self.adapter_hashes))

    def _record_recipes(self) -> None:
        """Store each recipe's spec with its pool (``genaug export`` reads prompts from it);
        an outage now leaves the rows to the next start (the export then asks for
        ``--recipes``), never the start itself."""
        try:
            for name, pid in self.pool_ids.items():
                self.store.recipe_specs.record(pid, self.recipes[name])
        except PoolError as exc:
            log.warning("pool %s: could not record its recipes' specs now (%s); the next "
                        "start does", self.store.location, exc)

    def connect(self, *, wake: Callable[[float], None], stored: Callable[[], None]) -> None:
        """``wake(delay)``: ask for idle work again after ``delay`` seconds (from any thread);
        ``stored()``: images were stored (from the store thread). Both must be thread-safe."""
        self._wake = wake
        self._stored = stored

    def target(self, name: str, label: str, shared: int = 0) -> int:
        """The fill ``label`` of recipe ``name`` is generated up to (see the module doc)."""
        return fill_target(own=self._targets[name][label], shared=shared,
                           limit=self._limit(name, label),
                           capacity=self.store.capacity_per_label, pregenerate=self.pregenerate)

    def asked(self, name: str, label: str, shared: int = 0) -> int:
        """The fill asked for ``label`` (in process, or ``shared`` through the pool): planned
        before background pre-generation (see the module doc)."""
        return asked_fill(own=self._targets[name][label], shared=shared,
                          limit=self._limit(name, label))

    def _limit(self, name: str, label: str) -> int:
        """The most a target may be: the capacity, and for real images images x variants."""
        spec = self.recipes[name].labels[label]
        return label_limit(capacity=self.store.capacity_per_label, images=spec.images,
                           sources=len(self.sources[name][label]),
                           variants_per_image=spec.variants_per_image)

    def add_demand(self, name: str, labels: Sequence[str], each: float) -> None:
        """Note that ``each`` images of each label were asked for (by a sample)."""
        self._demand.add(name, labels, each, now=time.monotonic())

    def report_need(self, name: str, client: str, need: Mapping[str, float]) -> None:
        """Replace ``client``'s need for ``name``'s labels (see :class:`NeedBoard`)."""
        self.need.report(name, client, need)
        self._wake(0.0)

    def raise_target(self, name: str, per_label: int) -> None:
        """Fill ``name``'s labels to at least ``per_label`` images, for this planner alone
        (in-process ``genaug pregenerate``; a shared fill is a job:
        :class:`~genaug.service.jobs.fill_jobs.FillJobs`)."""
        self._check_per_label(per_label)
        targets = self._targets[name]
        for label in targets:
            targets[label] = max(targets[label], per_label)
        self._wake(0.0)

    def _check_per_label(self, per_label: int) -> None:
        capacity = self.store.capacity_per_label
        if per_label > capacity:
            raise InvalidRequestError(
                f"per_label {per_label} exceeds the pool capacity per label {capacity}; ask "
                "for fewer or set GENAUG_POOL_CAPACITY_PER_LABEL",
                field="per_label",
            )

    def plan_fill(self, name: str, per_label: int) -> tuple[dict[str, int], dict[str, int]]:
        """A shared fill of every label of ``name`` to ``per_label``: ``(asked, targets)``,
        what each label is asked to hold (at most its limit: its capacity, or for real images
        images x variants) and the shared target it is raised to."""
        self._check_per_label(per_label)
        labels = self._targets[name]
        return ({label: min(per_label, self._limit(name, label)) for label in labels},
                dict.fromkeys(labels, per_label))

    def plan_budget(self, name: str, images: int
                    ) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        """Ask for ``images`` more images of ``name`` than are asked for now, split over its
        labels by their weights (:func:`label_weight`: recent demand and the trainers'
        combined need) with :func:`allocate`, each within its room: its limit (see
        :meth:`target`) less the larger of its planned fill (stored and in flight) and what
        was asked before. Each label's shared ask rises by its share, and asked-for images go
        before background pre-generation: on a pre-generating service, whose every label is
        already headed for the capacity, the budget moves that many images of the remaining
        work forward, by need. When the room is less than ``images``, the room is asked for
        (the answer says how many). Returns ``(shares, targets, allocation)``: the labels
        given a share, the shared target each is raised to (the job's, stored with it in one
        transaction) and every label's share. Raises
        :class:`~genaug.service.errors.PoolFullError` (409: it depends on the pool, not on the
        body) only when no label has room left. Blocking: call it from a thread."""
        recipe = self.recipes[name]
        pid = self.pool_ids[name]
        stats = self.store.stats(pid, recipe.label_names)  # one snapshot
        base = {label: max(s.fill + s.reserved, self.asked(name, label, s.target))
                for label, s in stats.items()}
        self._check_acceptance(name, stats)
        stopped = self.stopped(name)
        room = {label: 0 if label in stopped
                else max(0, self._limit(name, label) - base[label]) for label in stats}
        if sum(room.values()) == 0 and stopped:
            raise PoolFullError(
                f"images {images}: no label of recipe {name!r} can take them: "
                f"{', '.join(sorted(stopped))} stopped (its judge accepts almost "
                f"none of its images; see GET /v1/recipes/{name}, 'stopped', for the fix), the "
                "others hold, are generating or were asked for their capacity",
                field="images",
            )
        if sum(room.values()) == 0:
            raise PoolFullError(
                f"images {images}: no room left in recipe {name!r}'s pool: every label holds, "
                f"is generating or was already asked for its capacity "
                f"({self.store.capacity_per_label} per label); sample from it, or set "
                "GENAUG_POOL_CAPACITY_PER_LABEL higher for a larger pool",
                field="images",
            )
        now = time.monotonic()
        demand = self._demand_now(name, recipe.label_names, now)
        need = self.need.combined(name, recipe.label_names, now=now)
        weights = {label: label_weight(recipe.label_names, label, demand, need)
                   for label in stats}
        alloc = allocate(images, room, weights)
        shares = {label: count for label, count in alloc.items() if count > 0}
        return shares, {label: base[label] + count for label, count in shares.items()}, alloc

    def _demand_now(self, name: str, labels: Sequence[str], now: float) -> dict[str, float]:
        return self._demand.current(name, labels, now=now)

    # -- IdleSource --------------------------------------------------------------------------

    def next_idle_batch(self, max_images: int) -> IdleWork | None:
        """The batch that most helps the pools now, or ``None`` when all are at target (or
        the pool database is unreachable: then the batcher is woken again after a back-off).

        Runs in a worker thread; every pool read and the reservation happen here."""
        try:
            self._outcomes.store_unsaved()
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
            self._wake(_SHARED_POLL_S)
        return work

    def _plan(self, max_images: int) -> IdleWork | None:
        now = time.monotonic()
        # Tier 0: what was asked for (fills, waiting samples); 1: background, to the capacity.
        candidates: list[Candidate] = []
        for name, recipe in self.recipes.items():
            stats = self.store.stats(self.pool_ids[name], recipe.label_names)
            self.last_stats[name] = stats
            self._check_acceptance(name, stats)
            stopped = self.stopped(name)
            tiers = (
                {label: 0 if label in stopped else self.asked(name, label, s.target)
                 for label, s in stats.items()},
                {label: 0 if label in stopped else self.target(name, label, s.target)
                 for label, s in stats.items()},
            )
            # Stored and in flight, every replica's, read in one snapshot.
            planned = {label: replace(s, fill=s.fill + s.reserved) for label, s in stats.items()}
            demand = self._demand_now(name, recipe.label_names, now)
            need = self.need.combined(name, recipe.label_names, now=now)
            for tier, targets in enumerate(tiers):
                if not any(targets.values()):
                    continue
                tier_planned = dict(planned)
                while True:
                    label = choose_label(tier_planned, targets, demand, need=need,
                                         batch=max_images)
                    if label is None:
                        break
                    score = label_score(tier_planned, label, targets[label], demand, need,
                                        batch=max_images)
                    candidates.append((tier, score, name, label,
                                       targets[label] - tier_planned[label].fill,
                                       targets[label]))
                    tier_planned[label] = replace(tier_planned[label], fill=targets[label])
        candidates += self._probe_work()
        # Asked-for work first, then the best score; the reservation re-checks under the
        # label's lock and may refuse.
        candidates.sort(key=lambda c: (c[0], -c[1]))
        for _, _, name, label, missing, target in candidates:
            if self.before_reserve is not None:
                self.before_reserve(name, label)
            count = max(1, min(max_images, missing))
            reservation = self.store.reserve(self.pool_ids[name], label, count, target=target)
            if reservation is not None:
                return self._work(name, label, reservation)
        return None

    def _work(self, name: str, label: str, reservation: Reservation) -> IdleWork:
        recipe, pid, sources = self.recipes[name], self.pool_ids[name], self.sources[name][label]
        drawn = self.samplers.sampling(name, label)
        key, items = plan_pool_batch(recipe, label, reservation.indices, sources, drawn)
        judge_key_, settings = self._judge_made.get(name, (None, None))
        made = BatchMade(
            scheduler=key.scheduler, adapter=key.adapter,
            adapter_scale=key.adapter_scale if key.adapter is not None else None,
            # What the worker runs this batch with: the key's steps and strength, its sampler.
            provenance=Provenance(
                steps=key.steps, guidance=drawn.guidance,
                strength=key.strength if key.mode == "img2img" else None,
                adapter_hash=self._adapter_hash(recipe, label), judge_key=judge_key_,
                judge_settings=settings, speed=drawn.speed, sampler=drawn.id))
        on_done, on_failed = self._outcomes.handlers(
            name, pid, label, items, reservation, made=made, size=recipe.output_size,
            channels=recipe.output_channels, sources=bool(sources))
        return IdleWork(key=key, items=items, on_done=on_done, on_failed=on_failed)

    # -- the low-acceptance stop and outcomes (their own modules) ---------------------------

    def _probe_work(self) -> list[Candidate]:
        """``auto``'s probes (:meth:`~genaug.service.sampling.pools.PoolSamplers.probe_needs`)
        as the last tier of work, for the labels last read and not stopped."""
        work: list[Candidate] = []
        for name, needs in self.samplers.probe_needs().items():
            counts, halted = self.last_stats.get(name, {}), self.stopped(name)
            for label, missing in needs.items():
                if label in halted or label not in counts:
                    continue
                planned = counts[label].fill + counts[label].reserved
                work.append((2, 0.0, name, label, missing, planned + missing))
        return work

    def stopped(self, name: str, *, cached: bool = False) -> dict[str, str]:
        """Labels of ``name`` the planner stopped spending on, each with why and the fix: this
        replica's and every replica's in the pool (:mod:`~genaug.service.pool.stops`;
        ``cached``: never the database, for the event loop)."""
        return {**self.stops.read(name, cached=cached), **self._acceptance.stopped(name)}

    def wake(self) -> None:
        """Plan again now (a job was cancelled, a target changed)."""
        self._wake(0.0)

    def _adapter_hash(self, recipe: Recipe, label: str) -> str | None:
        adapter = recipe.adapter_for(label)
        return None if adapter is None else self.adapter_hashes.get(adapter.name)

    def _check_acceptance(self, name: str, stats: Mapping[str, LabelStats]) -> None:
        """Stop labels whose judge accepts too few (:mod:`~genaug.service.pool.acceptance`).
        An ``auto`` pool's labels are judged on the images of the samplers that draw them,
        never on a candidate's probes (:meth:`PoolSamplers.stop_evidence`)."""
        judge = self.judges.get(name)
        if judge is None:
            return
        evidence = self.samplers.stop_evidence(name)
        if evidence is not None:
            stats = {label: replace(s, judged_total=evidence.get(label, (0, 0))[0],
                                    accepted_total=evidence.get(label, (0, 0))[1])
                     for label, s in stats.items()}
        self._acceptance.check(name, stats, judge)

    @property
    def unsaved_images(self) -> int:
        """Images made during an outage and not stored yet."""
        return self._outcomes.unsaved_images

    def _pause(self, exc: BaseException) -> None:
        if not self.paused:
            log.warning("pre-generation paused: %s", exc)
        self.paused = True
        self._backoff_s = min(_MAX_BACKOFF_S, max(0.5, self._backoff_s * 2))
        self._wake(self._backoff_s)

    def _images_added(self, name: str, count: int) -> None:
        """Store thread: note the rate and tell samplers waiting for images."""
        self.samplers.stored(name)
        with self._lock:
            added, now = self._added[name], time.monotonic()
            added.append((now, count))
            while added and added[0][0] < now - _RATE_WINDOW_S:
                added.popleft()
        self._stored()
        # Plan once more after the store: the last planning pass may have run while this
        # batch was in flight, and last_stats (the pending-images gauge) would keep its counts.
        self._wake(0.0)

    def generation_rate(self, name: str) -> float:
        """Images per second added to ``name``'s pool by this replica over the last minute."""
        now = time.monotonic()
        with self._lock:
            recent = [(t, c) for t, c in self._added[name] if t >= now - _RATE_WINDOW_S]
        if not recent:
            return 0.0
        span = max(now - recent[0][0], 1.0)
        return sum(c for _, c in recent) / span


def pool_model_hash(model: LoadedModel) -> str:
    """The model identity pools are keyed on: weights and dtype (images differ across both)."""
    return f"{model.weights_hash}-{str(model.dtype).removeprefix('torch.')}"

