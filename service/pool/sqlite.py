"""The SQLite backend of the pool: one file, the embedded default for one machine.

Durability. The file is in WAL mode with ``synchronous=NORMAL``: every batch is one transaction,
a commit appends to the write-ahead log without an fsync, and the log is fsynced at checkpoints.
A process kill (SIGKILL, OOM) loses nothing committed, because committed pages are already in
the OS cache; a power loss or OS crash can roll back the last few commits. In both cases SQLite
recovers to a consistent database on the next open (``PRAGMA integrity_check`` is ``ok``) and at
worst the batch in flight is lost — which the pool tolerates by design (it is a cache of
regenerable images), so the fsync per commit of ``synchronous=FULL`` is not worth its cost.

Threads. One SQLite connection per thread (``threading.local``), all opened with
``check_same_thread=False`` only so that :meth:`close` can close them from the thread that owns
the store; otherwise each connection is used by its own thread alone. Writers take SQLite's
write lock (``BEGIN IMMEDIATE``: the label locks of :class:`~genaug.service.pool.store.PoolStore`
are this one lock) and wait up to ``busy_timeout_s`` for each other; readers run beside them
on their WAL snapshot. :meth:`SqlitePoolStore.sample_now` (the service's event loop) uses a
second connection of its thread whose busy timeout is 0 (it gives up at once instead) and
which never checkpoints the WAL (that I/O is left to the other connections' commits).

Replicas with separate files: give each a plan partition (``GENAUG_REPLICA=i/N``) so that
replica i only uses plan indices congruent to i mod N and no two replicas make the same image.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .draw import decode_rows, empty_sample, spread
from .sampler_queries import rekey_samplers
from .store import PoolStore
from .tables import SQLITE, schema_indexes, schema_tables
from .types import DEFAULT_LEASE_S, SCHEMA_VERSION, PoolError, PoolSample, PoolSchemaError

__all__ = ["SqlitePoolStore"]

log = logging.getLogger(__name__)

# The layout a new file gets is pool/tables.py's, in SQLite's words; an older file gets the
# tables it lacks there, and the columns it lacks here, by the version that added them. An
# image stored before a column existed keeps NULL there: not recorded.
_TABLES = schema_tables(SQLITE)

_V3_COLUMNS = {
    "images": {
        "score": "REAL",
        "judge_keep": "INTEGER NOT NULL DEFAULT 1",
        "verdict": "TEXT",
        "verdict_at": "REAL",
        "accepted": "INTEGER NOT NULL DEFAULT 1",
    },
    "counters": {
        "judged_total": "INTEGER NOT NULL DEFAULT 0",
        "accepted_total": "INTEGER NOT NULL DEFAULT 0",
    },
}

# Version 4 -> 5: the first attempt of a webhook.
_V5_JOB_COLUMNS = {"webhook_first": "REAL"}

# Version 5 -> 6: the mode and sampler that made each image (NULL before: not recorded).
_V6_COLUMNS = {"speed": "TEXT", "sampler": "TEXT"}

_V4_COLUMNS = {
    "steps": "INTEGER",
    "guidance": "REAL",
    "strength": "REAL",
    "adapter_hash": "TEXT",
    "judge_key": "TEXT",
    "judge_settings": "TEXT",
}

_V2_COLUMNS = {
    "channels": "INTEGER NOT NULL DEFAULT 3",
    "plan_index": "INTEGER",
    "source": "TEXT",
    "scheduler": "TEXT NOT NULL DEFAULT 'default'",
    "adapter": "TEXT",
    "adapter_scale": "REAL",
}


def _is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` (or the SQLite error behind a :class:`PoolError`) is SQLITE_BUSY or
    SQLITE_LOCKED: another connection holds a lock this one did not wait for."""
    cause = exc if isinstance(exc, sqlite3.Error) else exc.__cause__
    code = getattr(cause, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


class SqlitePoolStore(PoolStore):
    """The pool in one SQLite file (WAL), safe to use from several threads and processes.

    Example::

        store = SqlitePoolStore(Path("pool.db"), capacity_per_label=1000, partition=(0, 2))
        store.reserve("shapes-0123456789ab", "circle", 8, target=100).indices  # [0, 2, ...]
    """

    backend = "sqlite"
    _NOW = "((julianday('now') - 2440587.5) * 86400.0)"
    _GREATEST = "max"

    def __init__(
        self,
        path: str | Path,
        *,
        capacity_per_label: int,
        partition: tuple[int, int] | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        busy_timeout_s: float = 30.0,
    ) -> None:
        super().__init__(path, capacity_per_label=capacity_per_label, partition=partition,
                         lease_s=lease_s)
        self.path = Path(path)
        self._busy_timeout_s = busy_timeout_s
        self._local = threading.local()
        self._lock = threading.Lock()
        self._conns: list[sqlite3.Connection] = []
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._init_schema()
        except PoolError:
            self.close()
            raise
        except (sqlite3.Error, OSError) as exc:
            self.close()
            raise PoolError(
                f"cannot open pool database {self.path}: {exc}; set GENAUG_POOL_PATH to a "
                "writable SQLite file (a new path creates a new pool)"
            ) from exc
        self._start_heartbeat()

    @property
    def location(self) -> str:
        return str(self.path)

    def _q(self, sql: str) -> str:
        return sql

    def _executemany(self, conn: sqlite3.Connection, sql: str, rows: object) -> None:
        conn.executemany(sql, rows)  # type: ignore[arg-type]

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
        # A thread has two connections: the usual one waits up to busy_timeout_s for the
        # write lock; the one sample_now uses does not wait at all.
        slot = "conn_nowait" if getattr(self._local, "nowait", False) else "conn"
        conn: sqlite3.Connection | None = getattr(self._local, slot, None)
        if conn is not None and not self._closed:
            return conn
        with self._lock:
            if self._closed:
                raise PoolError(f"pool {self.path} is closed")
            conn = self._connect()
            if slot == "conn_nowait":
                # Never wait for a lock, and never run the WAL checkpoint a commit may trigger
                # (copying the log into the file and syncing it: the event loop must not). The
                # other connections' commits (batches stored, lease renewals) checkpoint.
                conn.execute("PRAGMA busy_timeout = 0")
                conn.execute("PRAGMA wal_autocheckpoint = 0")
            self._conns.append(conn)
        setattr(self._local, slot, conn)
        return conn

    def sample(self, pool_id: str, labels: Sequence[str], n: int,
               rng: np.random.Generator | None = None) -> PoolSample:
        """:meth:`~genaug.service.pool.store.PoolStore.sample` in Python: one snapshot reads
        each label's accepted ids and served counts and fetches the rows chosen (least
        served first, ``rng`` among equals); a write transaction counts them served."""
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
                for lo in range(0, len(ids), self._CHUNK):
                    part = ids[lo : lo + self._CHUNK]
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
            for lo in range(0, len(served_ids), self._CHUNK):
                part = served_ids[lo : lo + self._CHUNK]
                marks = ",".join("?" * len(part))
                self._exec(conn, f"UPDATE images SET served = served + 1 WHERE id IN ({marks})",
                           part)
        return sample

    def sample_now(self, pool_id: str, labels: Sequence[str], n: int) -> PoolSample | None:
        """:meth:`~genaug.service.pool.store.PoolStore.sample` on this thread, or ``None`` at once
        when another writer holds the write lock (a batch being stored, a lease renewal).

        Reads never wait in WAL mode; only counting the images served takes the write lock,
        so a sample answered here is exactly :meth:`sample`, and one that is not has changed
        nothing (its transaction rolled back)."""
        self._local.nowait = True
        try:
            return self.sample(pool_id, labels, n)
        except (sqlite3.OperationalError, PoolError) as exc:
            if _is_busy(exc):
                return None
            raise
        finally:
            self._local.nowait = False

    @contextmanager
    def _tx(self, *, write: bool) -> Iterator[sqlite3.Connection]:
        """One transaction: IMMEDIATE (takes the write lock now) or a deferred read snapshot."""
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.OperationalError as exc:
            raise PoolError(f"pool {self.path}: {exc}") from exc
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _init_schema(self) -> None:
        with self._tx(write=True) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            fresh = "images" not in tables
            if "meta" in tables:
                row = conn.execute(
                    "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                version = int(row[0]) if row else (1 if not fresh else SCHEMA_VERSION)
            else:
                version = 1 if not fresh else SCHEMA_VERSION
            if version > SCHEMA_VERSION:
                raise PoolSchemaError(
                    f"{self.path} has pool schema version {version}, newer than this genaug "
                    f"knows ({SCHEMA_VERSION}); upgrade genaug (pip install -U genaug) or point "
                    "GENAUG_POOL_PATH at another file"
                )
            for statement in _TABLES:
                conn.execute(statement)
            added = {"images": {**(_V2_COLUMNS if version < 2 else {}),
                                **(_V3_COLUMNS["images"] if version < 3 else {}),
                                **(_V4_COLUMNS if version < 4 else {}),
                                **(_V6_COLUMNS if version < 6 else {})},
                     "counters": _V3_COLUMNS["counters"] if version < 3 else {},
                     "jobs": _V5_JOB_COLUMNS if version < 5 else {}}
            for table, columns in added.items():
                have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
                for column, decl in columns.items():
                    if column not in have:
                        conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
            if version < SCHEMA_VERSION:
                log.warning("pool %s: upgrading schema version %d to %d in place",
                            self.path, version, SCHEMA_VERSION)
            for statement in schema_indexes():
                conn.execute(statement)
            if version < 7 and not fresh:
                rekey_samplers(conn.execute)
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('schema_version', ?) ON CONFLICT (key)"
                " DO UPDATE SET value = excluded.value",
                (str(SCHEMA_VERSION),),
            )

    def _close_connections(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:  # pragma: no cover - best effort at shutdown
                log.warning("error closing pool connection to %s", self.path, exc_info=True)

    def close(self) -> None:
        """Give back this store's reservations and close every connection; idempotent."""
        if not hasattr(self, "_conns"):  # failed before connecting
            self._closed = True
            return
        super().close()

    def integrity_check(self) -> str:
        """``PRAGMA integrity_check`` plus the orphan check: ``"ok"`` for a sound file."""
        rows = self._conn().execute("PRAGMA integrity_check").fetchall()
        text = "\n".join(str(r[0]) for r in rows)
        return text if text != "ok" else super().integrity_check()
