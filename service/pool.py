"""Persistent image pool: generated images kept per (pool, label) in one SQLite file.

A pool is identified by :func:`genaug.service.recipes.pool_id` (recipe name + hash of its
generation spec and of the model weights), so images made under another prompt or model are
never mixed in. Each ``images`` row keeps its seed, label, creation time, model hash, size and
how often it was served; its pixels (raw uint8 HWC bytes) sit in ``image_data`` under the same
id, because SQLite rewrites a whole record on UPDATE and every serve updates the served count.
A ``counters`` row per (pool, label) keeps the totals generated and served and
``next_index``, the number of plan indices ever handed out, so a restarted service continues the
recipe's seed plan without repeating a seed.

Durability. The file is in WAL mode with ``synchronous=NORMAL``: every batch is one transaction,
a commit appends to the write-ahead log without an fsync, and the log is fsynced at checkpoints.
A process kill (SIGKILL, OOM) loses nothing committed, because committed pages are already in
the OS cache; a power loss or OS crash can roll back the last few commits. In both cases SQLite
recovers to a consistent database on the next open (``PRAGMA integrity_check`` is ``ok``) and at
worst the batch in flight is lost — which the pool tolerates by design (it is a cache of
regenerable images), so the fsync per commit of ``synchronous=FULL`` is not worth its cost.

Threads. One SQLite connection per thread (``threading.local``), all opened with
``check_same_thread=False`` only so that :meth:`PoolStore.close` can close them from the thread
that owns the store; otherwise each connection is used by its own thread alone. The generator
worker thread writes; the event loop reads and samples through ``asyncio.to_thread``. WAL lets
readers run while a batch is being written; writers take SQLite's write lock
(``BEGIN IMMEDIATE``) and wait up to ``busy_timeout_s`` for each other.

Sampling policy. Within a label, the least-served images go first, random among equals: every
image is served once before any is served twice, so a consumer sees the whole pool, and together
with evicting the most-served images first the pool keeps getting fresher. Across labels the
``n`` images are spread as evenly as the labels' fills allow (water-filling); one sample never
contains the same image twice, so it may hold fewer than ``n`` when the pool is small.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["LabelStats", "PoolError", "PoolSample", "PoolStore", "choose_label"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
_CHUNK = 500  # ids per "IN (...)" clause: far below SQLITE_MAX_VARIABLE_NUMBER

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS images (
    id         INTEGER PRIMARY KEY,
    pool_id    TEXT    NOT NULL,
    label      TEXT    NOT NULL,
    seed       INTEGER NOT NULL,
    created    REAL    NOT NULL,
    model_hash TEXT    NOT NULL,
    served     INTEGER NOT NULL DEFAULT 0,
    height     INTEGER NOT NULL,
    width      INTEGER NOT NULL
);
-- Pixels live apart from the metadata: SQLite rewrites a whole record on UPDATE, and serving
-- an image updates its served count, so an inline blob would be rewritten at every serve.
-- (No semicolons in these comments: the schema is split on them.)
CREATE TABLE IF NOT EXISTS image_data (
    id   INTEGER PRIMARY KEY REFERENCES images (id),
    data BLOB NOT NULL
);
-- Sampling (least served), eviction (most served) and fill counts all walk this index.
CREATE INDEX IF NOT EXISTS images_pool_label_served ON images (pool_id, label, served);
CREATE TABLE IF NOT EXISTS counters (
    pool_id         TEXT    NOT NULL,
    label           TEXT    NOT NULL,
    generated_total INTEGER NOT NULL DEFAULT 0,
    served_total    INTEGER NOT NULL DEFAULT 0,
    next_index      INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (pool_id, label)
) WITHOUT ROWID;
"""


class PoolError(RuntimeError):
    """The pool database cannot be opened or used; the message says why and what to do."""


@dataclass(frozen=True)
class LabelStats:
    """Counts for one label of one pool.

    ``fill``: images stored now; ``generated``: images ever added; ``served``: images ever
    served; ``next_index``: plan indices ever handed out; ``fill_served``: sum of the served
    counts of the images stored now (``fill_served / fill`` is how worn the label is).
    """

    fill: int = 0
    generated: int = 0
    served: int = 0
    next_index: int = 0
    fill_served: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class PoolSample:
    """Images drawn from a pool, grouped by label in the order the labels were requested.

    ``images`` uint8 [n, h, w, 3] (writable; shape (0, 0, 0, 3) when nothing was available),
    ``labels`` the label name of each image, ``seeds`` int64 [n].
    """

    images: npt.NDArray[np.uint8]
    labels: list[str]
    seeds: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.labels)

    def label_indices(self, label_names: Sequence[str]) -> npt.NDArray[np.int32]:
        """int32 index of each image's label in ``label_names`` (e.g. a recipe's labels)."""
        index = {name: i for i, name in enumerate(label_names)}
        try:
            return np.fromiter((index[x] for x in self.labels), np.int32, len(self.labels))
        except KeyError as exc:
            raise KeyError(f"label {exc.args[0]!r} is not in {list(label_names)}") from None


class PoolStore:
    """SQLite-backed image pool (WAL, one file), safe to use from several threads.

    Example::

        store = PoolStore(Path("pool.db"), capacity_per_label=1000)
        start = store.next_index(pid, "P")
        ...  # generate images for recipe.plan("P", start + k), k < 8
        store.add(pid, "P", images, seeds, model_hash=model.weights_hash, next_index=start + 8)
        sample = store.sample(pid, ["I", "P", "R"], 64)
        sample.images.shape                     # (<=64, h, w, 3)
        store.close()
    """

    def __init__(
        self, path: Path, *, capacity_per_label: int, busy_timeout_s: float = 30.0
    ) -> None:
        if capacity_per_label < 1:
            raise ValueError(f"capacity_per_label must be >= 1, got {capacity_per_label}")
        self.path = Path(path)
        self.capacity_per_label = capacity_per_label
        self._busy_timeout_s = busy_timeout_s
        self._local = threading.local()
        self._lock = threading.Lock()
        self._conns: list[sqlite3.Connection] = []
        self._closed = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._init_schema()
        except (sqlite3.Error, OSError) as exc:
            self.close()
            raise PoolError(
                f"cannot open pool database {self.path}: {exc}; set GENAUG_POOL_PATH to a "
                "writable SQLite file (a new path creates a new pool)"
            ) from exc

    # -- connections and transactions -------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            timeout=self._busy_timeout_s,
            isolation_level=None,  # we issue BEGIN/COMMIT ourselves
            check_same_thread=False,  # only so close() may close it; see module docstring
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_s * 1000)}")
            conn.execute("PRAGMA page_size = 16384")  # no-op unless the file is new
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise PoolError(
                    f"{self.path}: could not switch to WAL mode (got {mode!r}); the pool needs "
                    "a local file system (not NFS or a read-only mount)"
                )
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA journal_size_limit = 67108864")  # trim the WAL to 64 MiB
        except BaseException:
            conn.close()
            raise
        return conn

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and not self._closed:
            return conn
        with self._lock:
            if self._closed:
                raise PoolError(f"pool {self.path} is closed")
            conn = self._connect()
            self._conns.append(conn)
        self._local.conn = conn
        return conn

    @contextmanager
    def _tx(self, *, write: bool) -> Iterator[sqlite3.Connection]:
        """One transaction: IMMEDIATE (takes the write lock now) or a deferred read snapshot."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _init_schema(self) -> None:
        with self._tx(write=True) as conn:
            for statement in _SCHEMA.split(";"):  # executescript() would COMMIT first
                if statement.strip():
                    conn.execute(statement)
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )
            elif int(row[0]) != SCHEMA_VERSION:
                raise PoolError(
                    f"{self.path} has pool schema version {row[0]}, this genaug uses "
                    f"{SCHEMA_VERSION}; point GENAUG_POOL_PATH at a new file"
                )

    def close(self) -> None:
        """Close every connection (call once the worker has stopped); idempotent."""
        with self._lock:
            self._closed = True
            conns, self._conns = self._conns, []
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:  # pragma: no cover - best effort at shutdown
                log.warning("error closing pool connection to %s", self.path, exc_info=True)

    def __enter__(self) -> PoolStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes -------------------------------------------------------------------------------

    def add(
        self,
        pool_id: str,
        label: str,
        images: npt.NDArray[np.uint8],
        seeds: Sequence[int] | npt.NDArray[np.integer[Any]],
        *,
        model_hash: str,
        next_index: int | None = None,
    ) -> int:
        """Store a batch of one label in one transaction; return how many images were evicted.

        ``images`` uint8 [n, h, w, 3]; ``seeds`` n ints. ``next_index``: the label's plan
        position after this batch (stored as max(old, new)); None leaves it as is (use
        :meth:`reserve`). Beyond ``capacity_per_label`` the most-served images go first, the
        oldest among equals, in the same transaction.
        """
        images = np.asarray(images)
        if images.dtype != np.uint8 or images.ndim != 4 or images.shape[3] != 3:
            raise ValueError(
                f"images must be uint8 [n, h, w, 3], got {images.dtype} {list(images.shape)}"
            )
        seed_list = [int(s) for s in np.asarray(seeds).reshape(-1)]
        if len(seed_list) != images.shape[0]:
            raise ValueError(f"{len(seed_list)} seeds for {images.shape[0]} images")
        images = np.ascontiguousarray(images)
        n, h, w = (int(x) for x in images.shape[:3])
        now = time.time()
        with self._tx(write=True) as conn:
            for i in range(n):
                cur = conn.execute(
                    "INSERT INTO images (pool_id, label, seed, created, model_hash, height,"
                    " width) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (pool_id, label, seed_list[i], now, model_hash, h, w),
                )
                conn.execute(
                    "INSERT INTO image_data (id, data) VALUES (?, ?)",
                    (cur.lastrowid, images[i].tobytes()),
                )
            conn.execute(
                "INSERT INTO counters (pool_id, label, generated_total, next_index)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (pool_id, label) DO UPDATE SET"
                " generated_total = generated_total + excluded.generated_total,"
                " next_index = max(next_index, excluded.next_index)",
                (pool_id, label, n, next_index or 0),
            )
            evicted = self._evict(conn, pool_id, label)
        if evicted:
            log.debug("pool %s label %s: evicted %d most-served", pool_id, label, evicted)
        return evicted

    def _evict(self, conn: sqlite3.Connection, pool_id: str, label: str) -> int:
        (count,) = conn.execute(
            "SELECT COUNT(*) FROM images WHERE pool_id = ? AND label = ?", (pool_id, label)
        ).fetchone()
        excess = int(count) - self.capacity_per_label
        if excess <= 0:
            return 0
        victims = conn.execute(
            "SELECT id FROM images WHERE pool_id = ? AND label = ?"
            " ORDER BY served DESC, id ASC LIMIT ?",
            (pool_id, label, excess),
        ).fetchall()
        conn.executemany("DELETE FROM image_data WHERE id = ?", victims)
        conn.executemany("DELETE FROM images WHERE id = ?", victims)
        return len(victims)

    def reserve(self, pool_id: str, label: str, n: int) -> int:
        """Atomically hand out plan indices ``start .. start+n-1`` and return ``start``.

        For several writers sharing one file: a batch lost in a crash leaves a gap in the
        plan, never a repeated seed. Pass ``next_index=None`` to :meth:`add` afterwards.
        """
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        with self._tx(write=True) as conn:
            conn.execute(
                "INSERT INTO counters (pool_id, label, next_index) VALUES (?, ?, ?)"
                " ON CONFLICT (pool_id, label) DO UPDATE SET next_index = next_index + ?",
                (pool_id, label, n, n),
            )
            (end,) = conn.execute(
                "SELECT next_index FROM counters WHERE pool_id = ? AND label = ?",
                (pool_id, label),
            ).fetchone()
        return int(end) - n

    def drop_pool(self, pool_id: str) -> int:
        """Delete a pool's images and counters (e.g. pools of an old spec); return rows gone."""
        with self._tx(write=True) as conn:
            conn.execute(
                "DELETE FROM image_data WHERE id IN (SELECT id FROM images WHERE pool_id = ?)",
                (pool_id,),
            )
            cur = conn.execute("DELETE FROM images WHERE pool_id = ?", (pool_id,))
            conn.execute("DELETE FROM counters WHERE pool_id = ?", (pool_id,))
            return int(cur.rowcount)

    # -- sampling -----------------------------------------------------------------------------

    def sample(
        self,
        pool_id: str,
        labels: Sequence[str],
        n: int,
        rng: np.random.Generator | None = None,
    ) -> PoolSample:
        """Draw up to ``n`` distinct images spread evenly over ``labels``; count them served.

        Labels without images get none and their share goes to the others; within a label the
        least-served images go first, random among equals. The result is grouped by label in
        the order of ``labels`` (duplicates ignored).
        """
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        rng = rng if rng is not None else np.random.default_rng()
        wanted = list(dict.fromkeys(labels))
        chosen: list[tuple[str, npt.NDArray[np.int64]]] = []
        with self._tx(write=False) as conn:  # one snapshot: chosen rows exist when fetched
            candidates = []
            for label in wanted:
                meta = conn.execute(
                    "SELECT id, served FROM images WHERE pool_id = ? AND label = ?",
                    (pool_id, label),
                ).fetchall()
                candidates.append(np.array(meta, dtype=np.int64).reshape(-1, 2))
            counts = _spread(n, [len(c) for c in candidates], rng)
            for label, cand, k in zip(wanted, candidates, counts, strict=True):
                if k == 0:
                    continue
                # served + U[0,1): least served first, uniformly random among equals
                keys = cand[:, 1] + rng.random(len(cand))
                pick = np.argpartition(keys, k - 1)[:k] if k < len(cand) else slice(None)
                chosen.append((label, cand[pick, 0]))
            names: list[str] = []
            rows: list[tuple[int, int, int, int, bytes]] = []
            for label, ids in chosen:
                id_list = ids.tolist()
                for lo in range(0, len(id_list), _CHUNK):
                    part = id_list[lo : lo + _CHUNK]
                    got = conn.execute(
                        "SELECT i.id, i.seed, i.height, i.width, d.data FROM images AS i"
                        " JOIN image_data AS d ON d.id = i.id"
                        f" WHERE i.id IN ({','.join('?' * len(part))})",
                        part,
                    ).fetchall()
                    rows.extend(got)
                    names.extend([label] * len(got))
        if not rows:
            return PoolSample(np.empty((0, 0, 0, 3), np.uint8), [], np.empty((0,), np.int64))

        h, w = rows[0][2], rows[0][3]
        all_ids: list[int] = []
        out = np.empty((len(rows), h, w, 3), np.uint8)
        seeds = np.empty((len(rows),), np.int64)
        for j, (image_id, seed, hh, ww, data) in enumerate(rows):
            if (hh, ww) != (h, w):
                raise PoolError(
                    f"pool {pool_id} holds images of different sizes ({h}x{w} and {hh}x{ww}); "
                    "a pool id must pin one output size: drop_pool() it and regenerate"
                )
            out[j] = np.frombuffer(data, np.uint8).reshape(h, w, 3)
            seeds[j] = seed
            all_ids.append(image_id)

        with self._tx(write=True) as conn:
            for lo in range(0, len(all_ids), _CHUNK):
                part = all_ids[lo : lo + _CHUNK]
                marks = ",".join("?" * len(part))
                conn.execute(f"UPDATE images SET served = served + 1 WHERE id IN ({marks})", part)
            conn.executemany(
                "INSERT INTO counters (pool_id, label, served_total) VALUES (?, ?, ?)"
                " ON CONFLICT (pool_id, label) DO UPDATE SET"
                " served_total = served_total + excluded.served_total",
                [(pool_id, label, len(ids)) for label, ids in chosen],
            )
        return PoolSample(out, names, seeds)

    # -- reads --------------------------------------------------------------------------------

    def fill(self, pool_id: str) -> dict[str, int]:
        """Images stored now, per label (labels with none are absent)."""
        with self._tx(write=False) as conn:
            rows = conn.execute(
                "SELECT label, COUNT(*) FROM images WHERE pool_id = ? GROUP BY label"
                " ORDER BY label",
                (pool_id,),
            ).fetchall()
        return {label: int(count) for label, count in rows}

    def stats(self, pool_id: str, labels: Sequence[str] | None = None) -> dict[str, LabelStats]:
        """Counts per label. With ``labels`` exactly those, in that order (zeros for unseen
        labels: pass a recipe's ``label_names`` to :func:`choose_label`); else every label the
        pool has seen, sorted."""
        with self._tx(write=False) as conn:
            fills = {
                label: (int(c), int(s))
                for label, c, s in conn.execute(
                    "SELECT label, COUNT(*), COALESCE(SUM(served), 0) FROM images"
                    " WHERE pool_id = ? GROUP BY label",
                    (pool_id,),
                )
            }
            counters = {
                label: (int(g), int(s), int(i))
                for label, g, s, i in conn.execute(
                    "SELECT label, generated_total, served_total, next_index FROM counters"
                    " WHERE pool_id = ?",
                    (pool_id,),
                )
            }
        names = list(labels) if labels is not None else sorted(fills.keys() | counters.keys())
        out = {}
        for label in names:
            fill, fill_served = fills.get(label, (0, 0))
            generated, served, next_index = counters.get(label, (0, 0, 0))
            out[label] = LabelStats(fill, generated, served, next_index, fill_served)
        return out

    def next_index(self, pool_id: str, label: str) -> int:
        """Plan indices handed out so far for the label (0 for a new pool)."""
        with self._tx(write=False) as conn:
            row = conn.execute(
                "SELECT next_index FROM counters WHERE pool_id = ? AND label = ?",
                (pool_id, label),
            ).fetchone()
        return int(row[0]) if row else 0

    def pools(self) -> list[str]:
        """Every pool id in the file, sorted."""
        with self._tx(write=False) as conn:
            rows = conn.execute("SELECT DISTINCT pool_id FROM counters ORDER BY 1").fetchall()
        return [r[0] for r in rows]

    def iter_images(
        self, pool_id: str, *, chunk: int = 256
    ) -> Iterator[tuple[str, int, npt.NDArray[np.uint8]]]:
        """Every image of a pool as ``(label, seed, uint8 [h, w, 3])``, without counting it
        served (for export)."""
        last = 0
        while True:
            with self._tx(write=False) as conn:
                rows = conn.execute(
                    "SELECT i.id, i.label, i.seed, i.height, i.width, d.data FROM images AS i"
                    " JOIN image_data AS d ON d.id = i.id WHERE i.pool_id = ? AND i.id > ?"
                    " ORDER BY i.id LIMIT ?",
                    (pool_id, last, chunk),
                ).fetchall()
            if not rows:
                return
            for image_id, label, seed, h, w, data in rows:
                last = image_id
                yield str(label), int(seed), np.frombuffer(data, np.uint8).reshape(h, w, 3)

    def integrity_check(self) -> str:
        """``PRAGMA integrity_check``: ``"ok"`` for a sound file, else SQLite's findings."""
        rows = self._conn().execute("PRAGMA integrity_check").fetchall()
        return "\n".join(str(r[0]) for r in rows)


def _spread(n: int, available: Sequence[int], rng: np.random.Generator) -> list[int]:
    """Split ``n`` over bins holding ``available`` items as evenly as they allow.

    Water-filling: equal shares, a bin that runs out gives its remainder to the others; the
    last indivisible remainder goes to randomly chosen bins (so no label is always favoured).
    """
    alloc = [0] * len(available)
    remaining = n
    while remaining > 0:
        open_bins = [i for i, a in enumerate(available) if alloc[i] < a]
        if not open_bins:
            break
        share = remaining // len(open_bins)
        if share == 0:
            for i in rng.choice(open_bins, size=remaining, replace=False):
                alloc[int(i)] += 1
            break
        for i in open_bins:
            give = min(share, available[i] - alloc[i])
            alloc[i] += give
            remaining -= give
    return alloc


def choose_label(
    stats: Mapping[str, LabelStats],
    capacity: int | Mapping[str, int],
    demand: Mapping[str, float] | None = None,
    *,
    refresh_served: float | None = None,
) -> str | None:
    """The label background generation should fill next, or None when there is nothing to do.

    ``capacity`` is one number for all labels or a target per label (labels without one, or
    with 0, are never chosen). Candidates are labels below it; with ``refresh_served`` set,
    also full labels
    whose images were served that often on average (generating evicts the most-served one, so
    a heavily used pool keeps getting fresher and stops once it is fresh again). Among them the
    highest ``(1 + m * share_of_demand) * (1 - fill / capacity)`` wins, ``m`` the number of
    labels: with no demand the emptiest label, with demand the most-demanded, weighed against
    how full it is. Ties go to the first label in ``stats`` order. ``demand`` is in any unit
    (recent requests, images asked for); only the proportions matter.

    Example::

        choose_label({"I": LabelStats(fill=10), "P": LabelStats(fill=0)}, 100)   # 'P'
    """
    if isinstance(capacity, int) and capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    demand = demand or {}
    total = sum(max(0.0, float(demand.get(label, 0.0))) for label in stats)
    m = len(stats)
    best: str | None = None
    best_score = -math.inf
    for label, s in stats.items():
        cap = capacity if isinstance(capacity, int) else capacity.get(label, 0)
        if cap < 1:
            continue  # no target for this label
        full = s.fill >= cap
        worn = (
            refresh_served is not None and s.fill > 0 and s.fill_served / s.fill >= refresh_served
        )
        if full and not worn:
            continue
        share = max(0.0, float(demand.get(label, 0.0))) / total if total > 0 else 0.0
        # a worn full label still needs a non-zero score so it can be chosen
        room = max(1.0 - s.fill / cap, 0.0) if not full else 0.5 / cap
        score = (1.0 + m * share) * room
        if score > best_score:
            best, best_score = label, score
    return best
