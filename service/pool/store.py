"""The pool store: the queries every backend shares, on one connection interface.

A pool is identified by :func:`genaug.service.recipes.spec.pool_id` (recipe name + hash of its
generation spec and of the model weights), so images made under another prompt or model are
never mixed in. Each ``images`` row keeps its seed, plan index, label, creation time, model
hash, size, channels, scheduler, adapter, img2img source hash, served count and curation
columns; its pixels (raw uint8 HWC bytes) sit in ``image_data`` under the same id, so that a
serve, which updates the served count, does not rewrite them.

Backends. :class:`PoolStore` is the database: connections, transactions, the schema's
version and the counting protocol below. A backend supplies the connection, the transaction,
the tables and their upgrades, and this module imports none:
:class:`~genaug.service.pool.sqlite.SqlitePoolStore` (one file, one machine:
``GENAUG_POOL_PATH``) and :class:`~genaug.service.pool.postgres.PostgresPoolStore` (one
database for any number of replicas: ``GENAUG_POOL_URL``), opened by
:func:`~genaug.service.pool.open.open_pool`. Shared values and errors:
:mod:`genaug.service.pool.types`.

Features compose over it through :meth:`PoolStore.unit_of_work` (one transaction holding the
labels' counter locks: :mod:`~genaug.service.pool.unit_of_work`), each an attribute:
``store.curation`` (a person's verdicts, browsing, an image's pixels:
:mod:`~genaug.service.pool.curation`), ``store.stops`` (the judge's stops),
``store.reads`` (listing, export, plan checks) and ``store.recipe_specs``. The fill jobs
compose the same way from outside the pool (:mod:`genaug.service.jobs.queries`); a feature
that holds leases hooks the heartbeat and close (``on_renew``, ``on_close``).

Lock order. Every writer (``reserve``, ``add``, ``verdict``, ``sample``'s served counts) first
takes the label's counter row lock (:meth:`PoolStore._lock_label`), several labels in sorted
order, so writers never deadlock; what it counts and changes is then in the same transaction.

Reservations. ``counters.next_index`` per (pool, label) counts the plan indices ever handed
out. :meth:`PoolStore.reserve` takes the label's lock, counts what is stored and what is in
flight **in one statement**, and, below the target, records a *reservation* (owner, plan
indices, count, lease) and advances the counter, all in one transaction. :meth:`PoolStore.add`
stores a reservation's images and deletes it in one transaction, so each planned image is
counted exactly once, in the fill or in flight: planners (threads, processes, replicas on one
database) stop together exactly at the target and never share a plan index; a crash leaves a
gap in the plan, never a repeat. The owner's heartbeat renews the lease; a dead owner's
reservations expire and their room is planned again, with new indices. A unique index on
(pool, label, plan index) makes a retried ``add`` harmless.

Counting and sampling. Everything that counts a label's fill counts *accepted* images only
(``reserve``, ``fill``, ``stats``, the capacity), and ``sample`` returns only those; rejected
ones are bounded apart (see :mod:`~genaug.service.pool.curation`). Within a label the
least-served images go first, random among equals, and eviction takes the most-served first,
so a consumer sees the whole pool and the pool keeps getting fresher; across labels ``n`` is
spread as evenly as the fills allow (:func:`~genaug.service.pool.draw.spread`), never the same
image twice in a sample.

Schema. ``meta.schema_version`` names the layout; a newer genaug upgrades an older database in
place (every image kept) and refuses a newer one
(:class:`~genaug.service.pool.types.PoolSchemaError`). Version 1: SQLite of genaug 0.1 (no
reservations, source, channels, adapter or scheduler); 2 adds them; 3 adds curation
(``score``, ``judge_keep``, ``verdict``, ``verdict_at``, ``accepted``, the lifetime counters
``judged_total`` and ``accepted_total``; an upgraded image is unjudged and accepted); 4 adds
``jobs`` and ``stops`` (:mod:`~genaug.service.pool.tables`) and each image's provenance
(``steps``, ``guidance``, ``strength``, ``adapter_hash``, ``judge_key``, ``judge_settings``:
NULL, "not recorded", for an image stored before); 5 adds ``recipes`` (each pool's recipe
spec) and a webhook's first attempt; 6 adds each image's ``speed`` and ``sampler``, the
``samplers`` table (an ``auto`` pool's decision: :mod:`~genaug.service.sampling.auto`) and
``sampler_tallies`` (judged and kept images per sampler, judge and adapter, counted by
``add``); 7 names every sampler by its stable id instead of its display name
(:func:`~genaug.service.pool.sampler_queries.rekey_samplers`).

Size. An image takes ``h * w * c`` bytes plus ~100 bytes of row: 1,000 1024² RGB images per
label for 10 labels is about 30 GiB (docs/deploy.md has the table). Beyond a few hundred GiB,
or with many replicas far from the database, pixels belong in object storage.

Why one file, long as it is: it is the one counting protocol, written once for
SQLite and PostgreSQL. Every query here that reserves, adds, evicts, samples or counts takes
the label's lock in the same order and counts accepted images the same way in one
transaction: that is what stops planners exactly at the target, no plan index repeated.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from .batch import batch_rows
from .curation import Curation
from .reads import PoolReads
from .recipe_specs import RecipeSpecs
from .sampler_queries import SamplerQueries
from .shared_targets import raise_targets
from .stop_queries import Stops
from .tables import POOL_TABLES
from .types import (
    DEFAULT_LEASE_S,
    AddedBatch,
    LabelStats,
    PoolError,
    PoolSample,
    Provenance,
    Reservation,
)
from .unit_of_work import UnitOfWork
from .workers import WorkerQueries

__all__ = ["PoolStore"]

log = logging.getLogger(__name__)


def _new_owner() -> str:
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class PoolStore(ABC):
    """An image pool in a database; safe to use from several threads and processes.

    Abstract: :func:`~genaug.service.pool.open.open_pool` opens a PostgreSQL pool for a
    ``postgresql://`` URL and a SQLite file otherwise (as ``pathlib.Path`` picks its flavour).
    Example::

        store = open_pool(Path("pool.db"), capacity_per_label=1000)
        res = store.reserve(pid, "P", 8, target=1000)  # None when P is at its target
        ...  # generate images for recipe.plan("P", i) for i in res.indices
        store.add(pid, "P", images, seeds, model_hash=model_hash, reservation=res)
        sample = store.sample(pid, ["I", "P", "R"], 64)
        sample.images.shape                     # (<=64, h, w, 3)
        store.close()

    ``partition`` ``(i, N)`` makes :meth:`reserve` hand out only indices congruent to i mod N
    (replicas with separate SQLite files); ``lease_s`` is how long a reservation lives
    without a heartbeat (renewed every ``lease_s / 3`` while the store is open).
    """

    backend: str = ""
    #: Whether other processes are expected to plan on the same pool (replicas on one
    #: database): the planner then looks again now and then while idle.
    shared: bool = False
    #: SQL for "now" in seconds since the epoch, evaluated by the database.
    _NOW: str = ""
    #: SQL name of the two-argument maximum.
    _GREATEST: str = ""
    #: Ids per "IN (...)" clause: far below either backend's parameter limit.
    _CHUNK: ClassVar[int] = 500

    def __init__(
        self,
        target: str | Path,
        *,
        capacity_per_label: int,
        partition: tuple[int, int] | None = None,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> None:
        if capacity_per_label < 1:
            raise ValueError(f"capacity_per_label must be >= 1, got {capacity_per_label}")
        if lease_s <= 0:
            raise ValueError(f"lease_s must be > 0, got {lease_s}")
        self.capacity_per_label = capacity_per_label
        self.partition = partition
        self.lease_s = lease_s
        self.owner = _new_owner()
        self._closed = False
        self._stop_heartbeat = threading.Event()
        self._heartbeat: threading.Thread | None = None
        #: Called on every heartbeat (a feature's leases: the fill jobs' webhook claims) and
        #: at close, before the connections go (a feature hands back what it holds), each in
        #: a write unit of work; their failures are the store's outage, logged.
        self.on_renew: list[Callable[[UnitOfWork], object]] = []
        self.on_close: list[Callable[[UnitOfWork], object]] = []
        #: Called by every :meth:`add` that stored images, in its transaction under the
        #: label's lock, with what it stored (``auto``'s tallies: ``samplers.tally``).
        self.on_added: list[Callable[[UnitOfWork, AddedBatch], object]] = []
        # The features that compose over the store, each through unit_of_work():
        #: A person's verdicts, browsing and an image's pixels (the pool page).
        self.curation = Curation(self)
        #: The judge's stops, every replica's.
        self.stops = Stops(self)
        #: Whole-pool reads: listing, export, plan checks.
        self.reads = PoolReads(self)
        #: The recipe spec that made each pool.
        self.recipe_specs = RecipeSpecs(self)
        #: ``auto``'s decisions and the tallies it decides on (counted as images are added).
        self.samplers = SamplerQueries(self)
        self.on_added.append(self.samplers.tally)
        #: The workers that announced themselves for an api (where they listen, their pools).
        self.workers = WorkerQueries(self, lease_s, on_renew=self.on_renew,
                                     on_close=self.on_close)

    # -- what a backend supplies ---------------------------------------------------------

    @abstractmethod
    def _tx(self, *, write: bool) -> AbstractContextManager[Any]:
        """One transaction: ``write`` may change rows; a read sees one snapshot."""

    @abstractmethod
    def _q(self, sql: str) -> str:
        """The backend's spelling of ``sql`` (written with ``?`` placeholders)."""

    @abstractmethod
    def _close_connections(self) -> None: ...

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the pool lives, for messages (a path, or a URL without its password)."""

    def _exec(self, conn: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        return conn.execute(self._q(sql), tuple(params))

    @contextmanager
    def unit_of_work(
        self, *, write: bool, locks: Mapping[str, Sequence[str]] | None = None
    ) -> Iterator[UnitOfWork]:
        """One transaction for a feature that composes over the store
        (:mod:`~genaug.service.pool.unit_of_work`): ``write`` may change rows (a read sees one
        snapshot); ``locks`` (pool id -> labels) are the counter locks taken first, every
        label sorted, as every writer of the store takes them."""
        with self._tx(write=write) as conn:
            uow = self._unit(conn)
            for pool_id, labels in sorted((locks or {}).items()):
                for label in sorted(set(labels)):
                    uow.lock(pool_id, label)
            yield uow

    def _unit(self, conn: Any) -> UnitOfWork:
        return UnitOfWork(conn, self._exec, self._lock_label, self._evict, now=self._NOW,
                          greatest=self._GREATEST, chunk=self._CHUNK)

    def _executemany(self, conn: Any, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        for row in rows:
            conn.execute(self._q(sql), tuple(row))

    def _lock_label(self, conn: Any, pool_id: str, label: str) -> int:
        """Create the label's counter row if needed, lock it until the transaction ends, and
        return its ``next_index``. Every writer of a label takes this lock first."""
        row = self._exec(
            conn,
            "INSERT INTO counters (pool_id, label) VALUES (?, ?) ON CONFLICT (pool_id, label)"
            " DO UPDATE SET next_index = counters.next_index RETURNING next_index",
            (pool_id, label),
        ).fetchone()
        return int(row[0])

    def integrity_check(self) -> str:
        """``"ok"`` for a sound database, else what is wrong (orphan pixels or rows)."""
        with self._tx(write=False) as conn:
            (orphans,) = self._exec(
                conn,
                "SELECT (SELECT COUNT(*) FROM image_data WHERE id NOT IN (SELECT id FROM"
                " images)) + (SELECT COUNT(*) FROM images WHERE id NOT IN (SELECT id FROM"
                " image_data))",
            ).fetchone()
        return "ok" if int(orphans) == 0 else f"{int(orphans)} images without pixels or rows"

    # -- lifecycle -------------------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        self._heartbeat = threading.Thread(
            target=self._beat, name="genaug-pool-lease", daemon=True
        )
        self._heartbeat.start()

    def _beat(self) -> None:
        while not self._stop_heartbeat.wait(self.lease_s / 3):
            try:
                self.renew()
            except PoolError as exc:  # an outage: the next beat tries again
                log.debug("pool lease renewal failed: %s", exc)

    def close(self) -> None:
        """Give back this store's reservations (and what its features hold: ``on_close``) and
        close every connection; idempotent."""
        if self._closed:
            return
        self._stop_heartbeat.set()
        if self._heartbeat is not None and self._heartbeat is not threading.current_thread():
            self._heartbeat.join(timeout=10)
        try:
            with self.unit_of_work(write=True) as uow:
                uow.execute("DELETE FROM reservations WHERE owner = ?", (self.owner,))
                for hand_back in self.on_close:
                    hand_back(uow)
        except Exception as exc:  # best effort: unreleased reservations expire by themselves
            log.info("pool %s: could not release reservations at close: %s", self.location, exc)
        self._closed = True
        self._close_connections()

    def __enter__(self) -> PoolStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- planning --------------------------------------------------------------------------

    def reserve(
        self, pool_id: str, label: str, n: int, *, target: int
    ) -> Reservation | None:
        """Reserve up to ``n`` plan indices of ``label`` if it is below ``target``.

        Under the label's lock: expired reservations are dropped, then stored + in-flight
        images are counted in one statement (stored: accepted images only, so a judged label
        goes on until it holds ``target`` accepted ones); the reservation holds
        ``min(n, target - both)`` indices, or the answer is None when there is no room.
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        with self._tx(write=True) as conn:
            next_index = self._lock_label(conn, pool_id, label)
            expired = self._exec(
                conn,
                "DELETE FROM reservations WHERE pool_id = ? AND label = ?"
                f" AND expires <= {self._NOW}",
                (pool_id, label),
            ).rowcount
            if expired:
                log.warning(
                    "pool %s label %s: %d reservation(s) of a stopped planner expired; "
                    "planning their images again", pool_id, label, expired,
                )
            fill, reserved = self._exec(
                conn,
                "SELECT (SELECT COUNT(*) FROM images WHERE pool_id = ? AND label = ?"
                " AND accepted = 1),"
                " (SELECT COALESCE(SUM(count), 0) FROM reservations"
                "  WHERE pool_id = ? AND label = ?)",
                (pool_id, label, pool_id, label),
            ).fetchone()
            room = int(target) - int(fill) - int(reserved)
            if room <= 0:
                return None
            count = min(n, room)
            offset, stride = self.partition if self.partition is not None else (0, 1)
            start = next_index + (offset - next_index) % stride
            end = start + (count - 1) * stride + 1
            self._exec(
                conn,
                "UPDATE counters SET next_index = ? WHERE pool_id = ? AND label = ?",
                (end, pool_id, label),
            )
            (rid,) = self._exec(
                conn,
                "INSERT INTO reservations (pool_id, label, owner, start_index, stride, count,"
                f" created, expires) VALUES (?, ?, ?, ?, ?, ?, {self._NOW}, {self._NOW} + ?)"
                " RETURNING id",
                (pool_id, label, self.owner, start, stride, count, self.lease_s),
            ).fetchone()
        return Reservation(int(rid), pool_id, label, start, stride, count)

    def release(self, reservation: Reservation) -> None:
        """Give back a reservation whose batch failed: its room is planned again (its indices
        stay a gap in the plan)."""
        with self._tx(write=True) as conn:
            self._exec(conn, "DELETE FROM reservations WHERE id = ?", (reservation.id,))

    def renew(self) -> int:
        """Extend the lease of every reservation this store holds (and its features' leases:
        ``on_renew``); return how many reservations."""
        with self._tx(write=True) as conn:
            cur = self._exec(
                conn,
                f"UPDATE reservations SET expires = {self._NOW} + ? WHERE owner = ?",
                (self.lease_s, self.owner),
            )
            renewed = int(cur.rowcount)
        for renew in self.on_renew:
            with self.unit_of_work(write=True) as uow:
                renew(uow)
        return renewed

    def set_target(self, pool_id: str, labels: Sequence[str], target: int) -> None:
        """Raise the labels' shared fill target to at least ``target`` (never lowers it)."""
        with self.unit_of_work(write=True) as uow:
            raise_targets(uow, pool_id, dict.fromkeys(labels, target))

    # -- writes ----------------------------------------------------------------------------

    def add(
        self,
        pool_id: str,
        label: str,
        images: npt.NDArray[np.uint8],
        seeds: Sequence[int] | npt.NDArray[np.integer[Any]],
        *,
        model_hash: str,
        next_index: int | None = None,
        reservation: Reservation | None = None,
        plan_indices: Sequence[int] | None = None,
        sources: Sequence[str | None] | None = None,
        scheduler: str = "default",
        adapter: str | None = None,
        adapter_scale: float | None = None,
        scores: Sequence[float] | None = None,
        keep: Sequence[bool] | None = None,
        provenance: Provenance | None = None,
        embedding_sum: Sequence[float] | None = None,
    ) -> int:
        """Store a batch of one label in one transaction; return how many images were evicted.

        ``images`` uint8 [n, h, w, c] with c 1 or 3; ``seeds`` n ints. With ``reservation``
        the reservation is deleted in the same transaction (``plan_indices`` then name each
        image's index, default ``reservation.indices``); an image whose plan index is already
        stored is skipped, so a retried add stores nothing twice. ``next_index``: the label's
        plan position after this batch when not reserving (stored as max(old, new)).
        Beyond ``capacity_per_label`` accepted images the most-served go first, the oldest
        among equals; beyond ``capacity_per_label`` rejected ones the oldest go first; both
        in the same transaction.

        ``scores``: the judge's score of each image (None: not judged); ``keep``: whether
        the judge kept each (needs ``scores``; default all kept). An image not kept is stored
        and counted (``rejected``, ``judged_total``) but never sampled. ``provenance``: what
        made the batch (steps, guidance, ...), stored with each image (None: not recorded).
        Each listener of :attr:`on_added` hears what was stored, in this transaction, with
        ``embedding_sum`` (the sum of the judged images' unit judge embeddings: ``auto``'s
        tallies add it up).
        """
        batch = batch_rows(images, seeds, plan_indices=plan_indices, sources=sources,
                           reservation=reservation, scores=scores, keep=keep)
        h, w, c = batch.shape
        made = provenance or Provenance()
        now = time.time()
        with self._tx(write=True) as conn:
            self._lock_label(conn, pool_id, label)  # writers of a label queue here, in order
            stored = judged = kept = 0
            for pixels, (seed, index, source, score, keeps) in zip(
                    batch.images, batch.columns, strict=True):
                row = self._exec(
                    conn,
                    "INSERT INTO images (pool_id, label, seed, plan_index, created, model_hash,"
                    " height, width, channels, source, scheduler, adapter, adapter_scale,"
                    " score, judge_keep, accepted, steps, guidance, strength, adapter_hash,"
                    " judge_key, judge_settings, speed, sampler) VALUES (?, ?, ?, ?, ?, ?, ?,"
                    " ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (pool_id, label, plan_index) DO NOTHING RETURNING id",
                    (pool_id, label, seed, index, now, model_hash, h, w, c, source, scheduler,
                     adapter, adapter_scale, score, int(keeps), int(keeps), made.steps,
                     made.guidance, made.strength, made.adapter_hash, made.judge_key,
                     made.judge_settings, made.speed, made.sampler),
                ).fetchone()
                if row is None:
                    log.info("pool %s label %s: plan index %s already stored; skipped",
                             pool_id, label, index)
                    continue
                self._exec(conn, "INSERT INTO image_data (id, data) VALUES (?, ?)",
                           (int(row[0]), pixels.tobytes()))
                stored += 1
                if score is not None:
                    judged += 1
                    kept += int(keeps)
            self._exec(
                conn,
                "UPDATE counters SET generated_total = generated_total + ?,"
                " judged_total = judged_total + ?, accepted_total = accepted_total + ?,"
                f" next_index = {self._GREATEST}(next_index, ?) WHERE pool_id = ? AND label = ?",
                (stored, judged, kept, next_index or 0, pool_id, label),
            )
            if stored:
                unit = self._unit(conn)
                added = AddedBatch(pool_id, label, made, judged, kept, embedding_sum)
                for listener in self.on_added:
                    listener(unit, added)
            if reservation is not None:
                self._exec(conn, "DELETE FROM reservations WHERE id = ?", (reservation.id,))
            evicted = self._evict(conn, pool_id, label)
        if evicted:
            log.debug("pool %s label %s: evicted %d", pool_id, label, evicted)
        return evicted

    def _evict(self, conn: Any, pool_id: str, label: str) -> int:
        """Keep at most ``capacity_per_label`` accepted images (most-served, then oldest, go
        first) and as many rejected ones (oldest go first); return how many went."""
        gone = 0
        for accepted, order in ((1, "served DESC, id ASC"), (0, "id ASC")):
            (count,) = self._exec(
                conn,
                "SELECT COUNT(*) FROM images WHERE pool_id = ? AND label = ? AND accepted = ?",
                (pool_id, label, accepted),
            ).fetchone()
            excess = int(count) - self.capacity_per_label
            if excess <= 0:
                continue
            victims = [
                int(r[0])
                for r in self._exec(
                    conn,
                    "SELECT id FROM images WHERE pool_id = ? AND label = ? AND accepted = ?"
                    f" ORDER BY {order} LIMIT ?",
                    (pool_id, label, accepted, excess),
                ).fetchall()
            ]
            self._delete_ids(conn, victims)
            gone += len(victims)
        return gone

    def _delete_ids(self, conn: Any, ids: Sequence[int]) -> None:
        for lo in range(0, len(ids), self._CHUNK):
            part = list(ids[lo : lo + self._CHUNK])
            marks = ",".join("?" * len(part))
            self._exec(conn, f"DELETE FROM image_data WHERE id IN ({marks})", part)
            self._exec(conn, f"DELETE FROM images WHERE id IN ({marks})", part)

    def drop_pool(self, pool_id: str,
                  also: Callable[[UnitOfWork, str], object] | None = None) -> int:
        """Delete a pool's images and its rows of every per-pool table
        (:data:`~genaug.service.pool.tables.POOL_TABLES`: counters, targets, reservations,
        stops, its recipe's spec and ``auto``'s decision and tallies, so that the pool filled
        again starts afresh); return images gone. ``also(uow, pool_id)`` runs in the same
        transaction (``genaug pool drop POOL_ID``
        fails the pool's live fill jobs there: ``JobQueries.fail_live``)."""
        with self._tx(write=True) as conn:
            ids = [int(r[0]) for r in self._exec(
                conn, "SELECT id FROM images WHERE pool_id = ?", (pool_id,)).fetchall()]
            self._delete_ids(conn, ids)
            for table in POOL_TABLES:
                self._exec(conn, f"DELETE FROM {table} WHERE pool_id = ?", (pool_id,))
            if also is not None:
                also(self._unit(conn), pool_id)
        return len(ids)

    # -- sampling --------------------------------------------------------------------------

    @abstractmethod
    def sample(self, pool_id: str, labels: Sequence[str], n: int,
               rng: np.random.Generator | None = None) -> PoolSample:
        """Draw up to ``n`` distinct images spread evenly over ``labels``; count them served.

        Only accepted images (see the module docstring: never one a judge or a person
        rejected). Labels without images get none and their share goes to the others; within
        a label the least-served images go first, random among equals. The result is grouped
        by label in the order of ``labels`` (duplicates ignored). Each backend chooses the
        rows its own way (SQLite in Python with ``rng``, PostgreSQL in one ranked query) and
        shares :mod:`~genaug.service.pool.draw`'s steps; every one counts the images served
        under the labels' counter locks, taken in label order as every writer takes them.
        """

    def sample_now(self, pool_id: str, labels: Sequence[str], n: int) -> PoolSample | None:
        """:meth:`sample` on the calling thread without waiting for a lock, or ``None`` when
        it would have to wait (then call :meth:`sample` where waiting is allowed).

        For the service's event loop: a local store answers a small sample in well under a
        millisecond, less than the hop to a worker thread costs. This backend never answers
        at once (a database across the network may always wait), so it returns ``None``.
        """
        return None

    # -- reads -----------------------------------------------------------------------------

    def fill(self, pool_id: str) -> dict[str, int]:
        """Accepted (sampleable) images stored now, per label (labels with none are absent)."""
        with self._tx(write=False) as conn:
            rows = self._exec(
                conn,
                "SELECT label, COUNT(*) FROM images WHERE pool_id = ? AND accepted = 1"
                " GROUP BY label"
                " ORDER BY label",
                (pool_id,),
            ).fetchall()
        return {str(label): int(count) for label, count in rows}

    def stats(self, pool_id: str, labels: Sequence[str] | None = None) -> dict[str, LabelStats]:
        """Counts per label, all from one snapshot. With ``labels`` exactly those, in that order
        (zeros for unseen labels: the planner passes a recipe's ``label_names`` to
        :func:`~genaug.service.pool.planner.choose_label`); else every label the pool has
        seen, sorted."""
        with self._tx(write=False) as conn:
            rows = self._exec(
                conn,
                "SELECT label, SUM(accepted), SUM(CASE WHEN accepted = 1 THEN served ELSE 0"
                " END), SUM(CASE WHEN accepted = 0 AND verdict IS NULL THEN 1 ELSE 0 END),"
                " SUM(CASE WHEN verdict = 'reject' THEN 1 ELSE 0 END), MAX(created) FROM images"
                " WHERE pool_id = ? GROUP BY label",
                (pool_id,),
            ).fetchall()
            fills = {str(label): tuple(int(v) for v in counts) for label, *counts, _ in rows}
            newest = {str(label): float(last) for label, *_, last in rows if last is not None}
            counters = {
                str(label): tuple(int(v) for v in values)
                for label, *values in self._exec(
                    conn,
                    "SELECT label, generated_total, served_total, next_index, judged_total,"
                    " accepted_total FROM counters WHERE pool_id = ?",
                    (pool_id,),
                ).fetchall()
            }
            reserved = {
                str(label): int(r)
                for label, r in self._exec(
                    conn,
                    "SELECT label, COALESCE(SUM(count), 0) FROM reservations"
                    f" WHERE pool_id = ? AND expires > {self._NOW} GROUP BY label",
                    (pool_id,),
                ).fetchall()
            }
            targets = {
                str(label): int(t)
                for label, t in self._exec(
                    conn, "SELECT label, target FROM targets WHERE pool_id = ?", (pool_id,)
                ).fetchall()
            }
        names = (
            list(labels)
            if labels is not None
            else sorted(fills.keys() | counters.keys() | reserved.keys() | targets.keys())
        )
        out = {}
        for label in names:
            fill, fill_served, rejected, by_person = fills.get(label, (0, 0, 0, 0))
            generated, served, next_index, judged, kept = counters.get(label, (0, 0, 0, 0, 0))
            out[label] = LabelStats(
                fill, generated, served, next_index, fill_served,
                reserved.get(label, 0), targets.get(label, 0),
                accepted=fill, rejected=rejected, rejected_by_person=by_person,
                judged_total=judged, accepted_total=kept, newest=newest.get(label),
            )
        return out
