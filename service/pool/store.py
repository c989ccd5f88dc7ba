"""The pool store: the queries every backend shares, on one connection interface.

A pool is identified by :func:`genaug.service.recipes.spec.pool_id` (recipe name + hash of its
generation spec and of the model weights), so images made under another prompt or model are
never mixed in. Each ``images`` row keeps its seed, plan index, label, creation time, model
hash, size, channels, the scheduler and adapter that made it, the hash of its img2img source
(variants) and how often it was served; its pixels (raw uint8 HWC bytes) sit in
``image_data`` under the same id, because a serve updates the served count and an inline blob
would be rewritten with it.

Backends. :class:`PoolStore` is the base and holds every query; a backend supplies the
connection, the transaction, the schema and its upgrades. This module imports no backend:

- :class:`~genaug.service.pool.sqlite.SqlitePoolStore`: one file, the embedded default for
  one machine (``GENAUG_POOL_PATH``).
- :class:`~genaug.service.pool.postgres.PostgresPoolStore`: one database shared by any
  number of replicas (``GENAUG_POOL_URL=postgresql://...``).

:func:`~genaug.service.pool.open.open_pool` opens the right one for a target (a
``postgresql://`` or ``postgres://`` URL, else a SQLite path);
:func:`~genaug.service.pool.open.open_pool_store` does it from the settings. The values and
errors they all share live in :mod:`genaug.service.pool.types`.

Plan indices and reservations. ``counters.next_index`` per (pool, label) is the number of plan
indices ever handed out. :meth:`PoolStore.reserve` takes a label's counter row lock, counts
what is stored and what is in flight **in one statement**, and, if the label is below its
target, records a *reservation* (owner, plan indices, count, lease) and advances the counter,
all in one transaction. :meth:`PoolStore.add` stores the images of a reservation and deletes
it in one transaction, so at every instant each planned image is counted exactly once: in the
fill or in flight. Several planners (threads, processes, replicas on one database) therefore
stop together exactly at the target and never share a plan index; a crash leaves a gap in the
plan, never a repeat. A reservation's lease is renewed by its owner's heartbeat; a killed
owner's reservations expire and their room is planned again, with new indices, by whoever is
alive. A unique index on (pool, label, plan index) makes a retried ``add`` harmless.

Sampling policy. Within a label, the least-served images go first, random among equals: every
image is served once before any is served twice, so a consumer sees the whole pool, and together
with evicting the most-served images first the pool keeps getting fresher. Across labels the
``n`` images are spread as evenly as the labels' fills allow (water-filling,
:func:`~genaug.service.pool.draw.spread`);
one sample never contains the same image twice, so it may hold fewer than ``n`` when the pool
is small.

Curation. Each image has the judge's ``score`` (NULL: not judged), the judge's keep flag
``judge_keep`` (images below the recipe's ``min_score`` are stored, counted and never sampled)
and a person's ``verdict`` (NULL: none; ``reject``; ``restore``, which overrides the judge's
reject). An image is *accepted* (sampleable) iff a person restored it, or no person rejected it
and the judge kept it; the column ``accepted`` holds that, kept up to date by :meth:`add` and
:meth:`verdict` under the label's lock. Everything that counts a label's fill counts accepted
images only: :meth:`reserve` (so a judged label goes on generating until it holds ``target``
accepted images), :meth:`fill`, :meth:`stats` (``fill``), the capacity and :meth:`sample`,
which never returns a rejected image. Rejected images (by the judge or a person) keep no room
of the accepted ones; they are bounded separately: at most ``capacity_per_label`` of them per
label, the oldest evicted first, so a label whose judge rejects most images cannot grow the
pool without limit. ``counters.judged_total`` and ``counters.accepted_total`` count what the
judge ever scored and kept (lifetime: eviction does not lower them).

Schema. ``meta.schema_version`` says which layout a database has; a newer genaug upgrades an
older database in place (every image kept) and refuses a database newer than it knows
(:class:`~genaug.service.pool.types.PoolSchemaError`). Version 1 is the SQLite layout of
genaug 0.1 (no reservations, no source, channels, adapter or scheduler columns); version 2
adds them; version 3 adds curation (``score``, ``judge_keep``, ``verdict``, ``verdict_at``,
``accepted`` and the two lifetime counters; an upgraded image is unjudged and accepted).

Size. An image takes ``h * w * c`` bytes plus ~100 bytes of row: a 1024² RGB image is 3 MiB,
so 1,000 images per label for 10 labels is about 30 GiB (docs/deploy.md has the table). Both
backends handle that; beyond a few hundred GiB, or with many replicas far from the database,
pixels belong in object storage with only their keys in these tables.

Why this file is longer than the house's 450 lines: it is one class, and its queries are one
protocol (every writer takes the label's counter row lock first, in label order; reserve,
add, evict and sample count what is stored and in flight in the same transactions). Split
over files, the lock order and the counting that keep generated equal to target could no
longer be read in one place; everything else (types, factory, the planner's label choice)
lives elsewhere.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .draw import decode_rows, empty_sample, spread
from .types import (
    DEFAULT_LEASE_S,
    BrowsePage,
    LabelStats,
    PoolError,
    PoolImage,
    PoolSample,
    Reservation,
    VerdictResult,
)

__all__ = ["PoolStore"]

log = logging.getLogger(__name__)

_CHUNK = 500  # ids per "IN (...)" clause: far below either backend's parameter limit
#: Most images one :meth:`PoolStore.browse` page returns.
BROWSE_MAX = 500


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
        """Give back this store's reservations and close every connection; idempotent."""
        if self._closed:
            return
        self._stop_heartbeat.set()
        if self._heartbeat is not None and self._heartbeat is not threading.current_thread():
            self._heartbeat.join(timeout=10)
        try:
            with self._tx(write=True) as conn:
                self._exec(conn, "DELETE FROM reservations WHERE owner = ?", (self.owner,))
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
        """Extend the lease of every reservation this store holds; return how many."""
        with self._tx(write=True) as conn:
            cur = self._exec(
                conn,
                f"UPDATE reservations SET expires = {self._NOW} + ? WHERE owner = ?",
                (self.lease_s, self.owner),
            )
            return int(cur.rowcount)

    def set_target(self, pool_id: str, labels: Sequence[str], per_label: int) -> None:
        """Raise the labels' shared fill target to at least ``per_label`` (never lowers it)."""
        with self._tx(write=True) as conn:
            for label in sorted(set(labels)):
                self._exec(
                    conn,
                    "INSERT INTO targets (pool_id, label, target) VALUES (?, ?, ?)"
                    " ON CONFLICT (pool_id, label) DO UPDATE SET"
                    f" target = {self._GREATEST}(targets.target, excluded.target)",
                    (pool_id, label, int(per_label)),
                )

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
        and counted (``rejected``, ``judged_total``) but never sampled.
        """
        images = np.asarray(images)
        if images.dtype != np.uint8 or images.ndim != 4 or images.shape[3] not in (1, 3):
            raise ValueError(
                f"images must be uint8 [n, h, w, c] with c 1 or 3, got {images.dtype} "
                f"{list(images.shape)}"
            )
        seed_list = [int(s) for s in np.asarray(seeds).reshape(-1)]
        n, h, w, c = (int(x) for x in images.shape)
        if len(seed_list) != n:
            raise ValueError(f"{len(seed_list)} seeds for {n} images")
        if plan_indices is None and reservation is not None and n == reservation.count:
            plan_indices = reservation.indices
        index_list: list[int | None] = (
            [int(i) for i in plan_indices] if plan_indices is not None else [None] * n
        )
        source_list = list(sources) if sources is not None else [None] * n
        if len(index_list) != n or len(source_list) != n:
            raise ValueError(f"{len(index_list)} plan indices and {len(source_list)} sources "
                             f"for {n} images")
        score_list, keep_list = _judged(n, scores, keep)
        images = np.ascontiguousarray(images)
        now = time.time()
        with self._tx(write=True) as conn:
            self._lock_label(conn, pool_id, label)  # writers of a label queue here, in order
            stored = judged = kept = 0
            for i in range(n):
                row = self._exec(
                    conn,
                    "INSERT INTO images (pool_id, label, seed, plan_index, created, model_hash,"
                    " height, width, channels, source, scheduler, adapter, adapter_scale,"
                    " score, judge_keep, accepted)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (pool_id, label, plan_index) DO NOTHING RETURNING id",
                    (pool_id, label, seed_list[i], index_list[i], now, model_hash, h, w, c,
                     source_list[i], scheduler, adapter, adapter_scale, score_list[i],
                     int(keep_list[i]), int(keep_list[i])),
                ).fetchone()
                if row is None:
                    log.info("pool %s label %s: plan index %s already stored; skipped",
                             pool_id, label, index_list[i])
                    continue
                self._exec(conn, "INSERT INTO image_data (id, data) VALUES (?, ?)",
                           (int(row[0]), images[i].tobytes()))
                stored += 1
                if score_list[i] is not None:
                    judged += 1
                    kept += int(keep_list[i])
            self._exec(
                conn,
                "UPDATE counters SET generated_total = generated_total + ?,"
                " judged_total = judged_total + ?, accepted_total = accepted_total + ?,"
                f" next_index = {self._GREATEST}(next_index, ?) WHERE pool_id = ? AND label = ?",
                (stored, judged, kept, next_index or 0, pool_id, label),
            )
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

    # -- curation --------------------------------------------------------------------------

    def verdict(
        self, pool_id: str, label: str, seeds: Sequence[int], *, keep: bool
    ) -> VerdictResult:
        """Apply a person's verdict to ``label``'s images with these ``seeds``, all or none.

        ``keep=False`` rejects them (never sampled again, by any replica, whatever the judge
        said); ``keep=True`` restores them (sampleable again; for an image the judge had
        rejected this overrides the judge). When a seed names no image of the label nothing
        is applied and the result lists it in ``unknown``. A verdict may change the label's
        fill (a reject lowers it, so the planner makes a replacement; a restore beyond the
        capacity evicts as :meth:`add` does).
        """
        wanted = list(dict.fromkeys(int(s) for s in seeds))
        now = time.time()
        with self._tx(write=True) as conn:
            self._lock_label(conn, pool_id, label)
            found: dict[int, list[tuple[int, bool, str | None]]] = {}
            for lo in range(0, len(wanted), _CHUNK):
                part = wanted[lo : lo + _CHUNK]
                for image_id, seed, judge_keep, verdict in self._exec(
                    conn,
                    "SELECT id, seed, judge_keep, verdict FROM images WHERE pool_id = ?"
                    f" AND label = ? AND seed IN ({','.join('?' * len(part))})",
                    [pool_id, label, *part],
                ).fetchall():
                    found.setdefault(int(seed), []).append(
                        (int(image_id), bool(judge_keep), verdict))
            unknown = [seed for seed in wanted if seed not in found]
            if unknown:
                return VerdictResult(unknown=unknown)
            changed: list[int] = []
            unchanged: list[int] = []
            updates: dict[tuple[str | None, int], list[int]] = {}
            for seed in wanted:
                moved = False
                for image_id, judge_keep, verdict in found[seed]:
                    new = "reject" if not keep else (None if judge_keep else "restore")
                    if new != verdict:
                        moved = True
                        updates.setdefault((new, int(keep)), []).append(image_id)
                (changed if moved else unchanged).append(seed)
            for (new, accepted), ids in updates.items():
                for lo in range(0, len(ids), _CHUNK):
                    part = ids[lo : lo + _CHUNK]
                    self._exec(
                        conn,
                        "UPDATE images SET verdict = ?, accepted = ?, verdict_at = ?"
                        f" WHERE id IN ({','.join('?' * len(part))})",
                        [new, accepted, now, *part],
                    )
            if updates:
                self._evict(conn, pool_id, label)
        if changed:
            log.info("pool %s label %s: a person %s %d image(s)", pool_id, label,
                     "restored" if keep else "rejected", len(changed))
        return VerdictResult(changed=changed, unchanged=unchanged)

    def browse(
        self, pool_id: str, label: str, *, rejected: bool, offset: int = 0, limit: int = 50
    ) -> BrowsePage:
        """One page of ``label``'s accepted images (``rejected=False``) or rejected ones (by
        the judge or a person), the least-scored first (unjudged last), then the oldest;
        ``total`` counts them all. Pixels: :meth:`image`."""
        if offset < 0 or not 1 <= limit <= BROWSE_MAX:
            raise ValueError(f"offset must be >= 0 and limit 1..{BROWSE_MAX}, got {offset}, "
                             f"{limit}")
        where = "pool_id = ? AND label = ? AND accepted = ?"
        params = (pool_id, label, 0 if rejected else 1)
        with self._tx(write=False) as conn:
            (total,) = self._exec(
                conn, f"SELECT COUNT(*) FROM images WHERE {where}", params).fetchone()
            rows = self._exec(
                conn,
                "SELECT seed, score, created, served, judge_keep, verdict FROM images"
                f" WHERE {where} ORDER BY score IS NULL, score, id LIMIT ? OFFSET ?",
                (*params, limit, offset),
            ).fetchall()
        return BrowsePage(int(total), offset, [
            PoolImage(int(seed), None if score is None else float(score), float(created),
                      int(served), bool(judge_keep), None if verdict is None else str(verdict))
            for seed, score, created, served, judge_keep, verdict in rows
        ])

    def image(self, pool_id: str, label: str, seed: int) -> npt.NDArray[np.uint8] | None:
        """The pixels (uint8 [h, w, c]) of ``label``'s image with ``seed``, accepted or not,
        without counting it served; None when there is none (the oldest when several)."""
        with self._tx(write=False) as conn:
            row = self._exec(
                conn,
                "SELECT i.height, i.width, i.channels, d.data FROM images AS i JOIN image_data"
                " AS d ON d.id = i.id WHERE i.pool_id = ? AND i.label = ? AND i.seed = ?"
                " ORDER BY i.id LIMIT 1",
                (pool_id, label, int(seed)),
            ).fetchone()
        if row is None:
            return None
        h, w, c, data = row
        return np.frombuffer(bytes(data), np.uint8).reshape(int(h), int(w), int(c)).copy()

    def _delete_ids(self, conn: Any, ids: Sequence[int]) -> None:
        for lo in range(0, len(ids), _CHUNK):
            part = list(ids[lo : lo + _CHUNK])
            marks = ",".join("?" * len(part))
            self._exec(conn, f"DELETE FROM image_data WHERE id IN ({marks})", part)
            self._exec(conn, f"DELETE FROM images WHERE id IN ({marks})", part)

    def drop_pool(self, pool_id: str) -> int:
        """Delete a pool's images, counters, targets and reservations; return images gone.

        ``genaug pool drop POOL_ID`` runs this (e.g. for pools of an old spec or model)."""
        with self._tx(write=True) as conn:
            ids = [int(r[0]) for r in self._exec(
                conn, "SELECT id FROM images WHERE pool_id = ?", (pool_id,)).fetchall()]
            self._delete_ids(conn, ids)
            for table in ("counters", "targets", "reservations"):
                self._exec(conn, f"DELETE FROM {table} WHERE pool_id = ?", (pool_id,))
        return len(ids)

    # -- sampling --------------------------------------------------------------------------

    def sample(
        self,
        pool_id: str,
        labels: Sequence[str],
        n: int,
        rng: np.random.Generator | None = None,
    ) -> PoolSample:
        """Draw up to ``n`` distinct images spread evenly over ``labels``; count them served.

        Only accepted images (see the module docstring: never one a judge or a person
        rejected). Labels without images get none and their share goes to the others; within
        a label the least-served images go first, random among equals. The result is grouped
        by label in the order of ``labels`` (duplicates ignored).
        """
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        rng = rng if rng is not None else np.random.default_rng()
        wanted = list(dict.fromkeys(labels))
        chosen: list[tuple[str, list[int]]] = []
        rows: list[tuple[int, int, int, int, int, str | None, bytes]] = []
        names: list[str] = []
        with self._tx(write=False) as conn:  # one snapshot: chosen rows exist when fetched
            candidates = []
            for label in wanted:
                meta = self._exec(
                    conn,
                    "SELECT id, served FROM images WHERE pool_id = ? AND label = ?"
                    " AND accepted = 1",
                    (pool_id, label),
                ).fetchall()
                candidates.append(np.array(meta, dtype=np.int64).reshape(-1, 2))
            counts = spread(n, [len(c) for c in candidates], rng)
            for label, cand, k in zip(wanted, candidates, counts, strict=True):
                if k == 0:
                    continue
                # served + U[0,1): least served first, uniformly random among equals
                keys = cand[:, 1] + rng.random(len(cand))
                pick = np.argpartition(keys, k - 1)[:k] if k < len(cand) else slice(None)
                chosen.append((label, cand[pick, 0].tolist()))
            for label, ids in chosen:
                for lo in range(0, len(ids), _CHUNK):
                    part = ids[lo : lo + _CHUNK]
                    got = self._exec(
                        conn,
                        "SELECT i.id, i.seed, i.height, i.width, i.channels, i.source, d.data"
                        " FROM images AS i JOIN image_data AS d ON d.id = i.id"
                        f" WHERE i.id IN ({','.join('?' * len(part))})",
                        part,
                    ).fetchall()
                    rows.extend(got)
                    names.extend([label] * len(got))
        if not rows:
            return empty_sample()
        sample = decode_rows(pool_id, [row[1:] for row in rows], names)
        served_ids = [int(row[0]) for row in rows]

        with self._tx(write=True) as conn:
            # Counter rows first, in label order, as every writer locks them: no deadlock.
            for label, ids in sorted(chosen):
                self._lock_label(conn, pool_id, label)
                self._exec(
                    conn,
                    "UPDATE counters SET served_total = served_total + ?"
                    " WHERE pool_id = ? AND label = ?",
                    (len(ids), pool_id, label),
                )
            for lo in range(0, len(served_ids), _CHUNK):
                part = served_ids[lo : lo + _CHUNK]
                marks = ",".join("?" * len(part))
                self._exec(conn, f"UPDATE images SET served = served + 1 WHERE id IN ({marks})",
                           part)
        return sample

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
            fills = {
                str(label): tuple(int(v) for v in values)
                for label, *values in self._exec(
                    conn,
                    "SELECT label, SUM(accepted), SUM(CASE WHEN accepted = 1 THEN served ELSE 0"
                    " END), SUM(CASE WHEN accepted = 0 AND verdict IS NULL THEN 1 ELSE 0 END),"
                    " SUM(CASE WHEN verdict = 'reject' THEN 1 ELSE 0 END) FROM images"
                    " WHERE pool_id = ? GROUP BY label",
                    (pool_id,),
                ).fetchall()
            }
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
                judged_total=judged, accepted_total=kept,
            )
        return out

    def next_index(self, pool_id: str, label: str) -> int:
        """Plan indices handed out so far for the label (0 for a new pool)."""
        with self._tx(write=False) as conn:
            row = self._exec(
                conn,
                "SELECT next_index FROM counters WHERE pool_id = ? AND label = ?",
                (pool_id, label),
            ).fetchone()
        return int(row[0]) if row else 0

    def pools(self) -> list[str]:
        """Every pool id in the database, sorted."""
        with self._tx(write=False) as conn:
            rows = self._exec(
                conn,
                "SELECT pool_id FROM counters UNION SELECT pool_id FROM images ORDER BY 1",
            ).fetchall()
        return [str(r[0]) for r in rows]

    def iter_images(
        self, pool_id: str, *, chunk: int = 256, include_rejected: bool = False
    ) -> Iterator[tuple[str, int, npt.NDArray[np.uint8]]]:
        """Every accepted image of a pool (with ``include_rejected`` every image) as
        ``(label, seed, uint8 [h, w, c])``, without counting it served (for export)."""
        last = 0
        only = "" if include_rejected else " AND i.accepted = 1"
        while True:
            with self._tx(write=False) as conn:
                rows = self._exec(
                    conn,
                    "SELECT i.id, i.label, i.seed, i.height, i.width, i.channels, d.data"
                    " FROM images AS i JOIN image_data AS d ON d.id = i.id"
                    f" WHERE i.pool_id = ? AND i.id > ?{only} ORDER BY i.id LIMIT ?",
                    (pool_id, last, chunk),
                ).fetchall()
            if not rows:
                return
            for image_id, label, seed, h, w, c, data in rows:
                last = int(image_id)
                image = np.frombuffer(bytes(data), np.uint8).reshape(h, w, c)
                yield str(label), int(seed), image

    def plan_indices(self, pool_id: str) -> dict[str, list[int]]:
        """Stored plan indices per label, sorted (images added without one are left out)."""
        with self._tx(write=False) as conn:
            rows = self._exec(
                conn,
                "SELECT label, plan_index FROM images WHERE pool_id = ? AND plan_index IS NOT"
                " NULL ORDER BY label, plan_index",
                (pool_id,),
            ).fetchall()
        out: dict[str, list[int]] = {}
        for label, index in rows:
            out.setdefault(str(label), []).append(int(index))
        return out

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


def _judged(
    n: int, scores: Sequence[float] | None, keep: Sequence[bool] | None
) -> tuple[list[float | None], list[bool]]:
    """The judge's scores and keep flags of ``n`` images, checked (None: not judged, kept)."""
    if scores is None:
        if keep is not None:
            raise ValueError("keep flags need the judge's scores (scores=...)")
        return [None] * n, [True] * n
    score_list: list[float | None] = [float(x) for x in np.asarray(scores).reshape(-1)]
    keep_list = [True] * n if keep is None else [bool(k) for k in np.asarray(keep).reshape(-1)]
    if len(score_list) != n or len(keep_list) != n:
        raise ValueError(f"{len(score_list)} scores and {len(keep_list)} keep flags for {n} "
                         "images")
    if not all(np.isfinite(x) for x in score_list if x is not None):
        raise ValueError(f"scores must be finite numbers, got {score_list}")
    return score_list, keep_list
