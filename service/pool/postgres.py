"""The PostgreSQL backend of the pool: one database shared by any number of replicas.

``GENAUG_POOL_URL=postgresql://user:password@host:5432/db`` (or ``postgres://``). Connections
come from a psycopg 3 connection pool (``psycopg_pool``), checked before each use so a database
restart costs one failed check, not a failed request; every call runs in the caller's thread
(the service calls the store from worker threads, never on the event loop).

Concurrency. Read operations run in ``REPEATABLE READ`` read-only transactions: one snapshot
for all their statements. Writers lock the label's ``counters`` row first (the
:class:`~genaug.service.pool.store.PoolStore` queries do), so plan indices, reservations and fills
of a label change in one order across all replicas, and the count of stored + reserved images
is taken in one statement after the lock.

Outages. A connection that cannot be had within ``connect_timeout_s`` raises
:class:`~genaug.service.pool.types.PoolConnectionError`; for one second after a failure further
calls fail at once instead of each waiting again (a sample answers 503 at once, not after
the timeout). The pool reconnects by itself once the
database is back.

Schema. Created on first use under an advisory lock (replicas starting together create it
once), versioned in ``meta`` like the SQLite file, upgraded in place, and refused when newer
than this genaug knows.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from .draw import decode_rows, empty_sample
from .sampler_queries import rekey_samplers
from .store import PoolStore
from .tables import POSTGRES, schema_indexes, schema_tables
from .types import (
    DEFAULT_LEASE_S,
    SCHEMA_VERSION,
    PoolConfigError,
    PoolConnectionError,
    PoolError,
    PoolSample,
    PoolSchemaError,
)

__all__ = ["DEFAULT_CONNECT_TIMEOUT_S", "PostgresPoolStore", "redact_url"]

DEFAULT_CONNECT_TIMEOUT_S = 3.0
"""Seconds a PostgreSQL connection may take before the pool counts as unreachable."""

log = logging.getLogger(__name__)

_ADVISORY_KEY = 0x67656E617567  # "genaug": serializes schema creation across replicas

_SCHEMA = [
    *schema_tables(POSTGRES),
    # Pixels are not compressible enough to be worth pglz: store them out of line as they are.
    "ALTER TABLE image_data ALTER COLUMN data SET STORAGE EXTERNAL",
]

#: Upgrades, by the version they start from. PostgreSQL pools start at version 2 (the first
#: version with this backend); the next column goes here as ``7: [...]`` (new tables and
#: indexes are pool/tables.py's, created on every open).
_UPGRADES: dict[int, list[str]] = {
    2: [  # curation: the judge's score and keep flag, a person's verdict, lifetime counters
        "ALTER TABLE images ADD COLUMN IF NOT EXISTS score DOUBLE PRECISION",
        "ALTER TABLE images ADD COLUMN IF NOT EXISTS judge_keep SMALLINT NOT NULL DEFAULT 1",
        "ALTER TABLE images ADD COLUMN IF NOT EXISTS verdict TEXT",
        "ALTER TABLE images ADD COLUMN IF NOT EXISTS verdict_at DOUBLE PRECISION",
        "ALTER TABLE images ADD COLUMN IF NOT EXISTS accepted SMALLINT NOT NULL DEFAULT 1",
        "ALTER TABLE counters ADD COLUMN IF NOT EXISTS judged_total BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE counters ADD COLUMN IF NOT EXISTS accepted_total BIGINT NOT NULL"
        " DEFAULT 0",
    ],
    3: [  # provenance of each image (NULL for those stored before: not recorded)
        "ALTER TABLE images ADD COLUMN IF NOT EXISTS steps INTEGER",
        "ALTER TABLE images ADD COLUMN IF NOT EXISTS guidance DOUBLE PRECISION",
        "ALTER TABLE images ADD COLUMN IF NOT EXISTS strength DOUBLE PRECISION",
        "ALTER TABLE images ADD COLUMN IF NOT EXISTS adapter_hash TEXT",
        "ALTER TABLE images ADD COLUMN IF NOT EXISTS judge_key TEXT",
        "ALTER TABLE images ADD COLUMN IF NOT EXISTS judge_settings TEXT",
    ],
    4: [  # the first attempt of a job's webhook (its delivery window runs from it)
        "ALTER TABLE jobs ADD COLUMN IF NOT EXISTS webhook_first DOUBLE PRECISION",
    ],
    5: [  # the mode and sampler that made each image (NULL before: not recorded)
        "ALTER TABLE images ADD COLUMN IF NOT EXISTS speed TEXT",
        "ALTER TABLE images ADD COLUMN IF NOT EXISTS sampler TEXT",
    ],
}


# Accepted images only, least served first, random among equals, spread over the labels as
# evenly as they allow: every label's rank-1 image, then every rank-2 one ... (water-filling),
# the last partial round to randomly chosen labels. Grouped by label in request order.
_SAMPLE = """
WITH ranked AS (
    SELECT id, label,
           row_number() OVER (PARTITION BY label ORDER BY served, random()) AS rn
    FROM images WHERE pool_id = %(pool)s AND label = ANY(%(labels)s) AND accepted = 1
), picked AS (
    SELECT id, label, rn FROM ranked ORDER BY rn, random() LIMIT %(n)s
)
SELECT i.id, p.label, i.seed, i.height, i.width, i.channels, i.source, d.data
FROM picked AS p JOIN images AS i ON i.id = p.id JOIN image_data AS d ON d.id = p.id
ORDER BY array_position(%(labels)s, p.label), p.rn
"""


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages and logs)."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] or type(exc).__name__


class PostgresPoolStore(PoolStore):
    """The pool in a PostgreSQL database, shared by every replica that names it.

    Example::

        store = PostgresPoolStore("postgresql://genaug:pw@db:5432/genaug",
                                  capacity_per_label=1000)
        res = store.reserve(pid, "P", 8, target=1000)  # indices no other replica gets
    """

    backend = "postgresql"
    shared = True
    _NOW = "EXTRACT(EPOCH FROM clock_timestamp())::float8"
    _GREATEST = "GREATEST"

    def __init__(
        self,
        url: str,
        *,
        capacity_per_label: int,
        partition: tuple[int, int] | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        max_connections: int = 8,
    ) -> None:
        super().__init__(url, capacity_per_label=capacity_per_label, partition=partition,
                         lease_s=lease_s)
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError as exc:  # pragma: no cover - the service extra installs both
            raise PoolConfigError(
                f"GENAUG_POOL_URL needs psycopg 3 and psycopg_pool ({exc}); "
                "pip install 'genaug[service]'"
            ) from None
        self._psycopg = psycopg
        self.url = url
        self._connect_timeout_s = connect_timeout_s
        self._down_since: float | None = None
        self._last_failure = 0.0
        self._down_lock = threading.Lock()
        self._q_cache: dict[str, str] = {}
        # One direct connection first: its error says exactly what is wrong (refused, bad
        # password, no such database), where the pool would only time out.
        try:
            first = psycopg.connect(url, connect_timeout=max(1, int(connect_timeout_s)))
        except psycopg.Error as exc:
            raise PoolConnectionError(
                f"cannot connect to the pool database {self.location}: {_one_line(exc)}; "
                "check GENAUG_POOL_URL (host, port, database, user, password) and that "
                "the server is up"
            ) from None
        try:
            self._init_schema(first)
        finally:
            first.close()
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=max_connections,
            open=False,
            timeout=connect_timeout_s,
            check=ConnectionPool.check_connection,
            # Give up reconnecting quickly: the next request starts a fresh attempt at once,
            # where the pool's own back-off would wait up to minutes after a short outage.
            reconnect_timeout=2.0,
            kwargs={"connect_timeout": max(1, int(connect_timeout_s))},
            name="genaug-pool",
        )
        self._pool.open(wait=True, timeout=connect_timeout_s * 2)
        self._start_heartbeat()

    @property
    def location(self) -> str:
        return redact_url(self.url)

    def _q(self, sql: str) -> str:
        out = self._q_cache.get(sql)
        if out is None:
            out = self._q_cache[sql] = sql.replace("?", "%s")
        return out

    # -- transactions ----------------------------------------------------------------------

    def _outage(self, exc: BaseException) -> PoolConnectionError:
        with self._down_lock:
            self._last_failure = time.monotonic()
            if self._down_since is None:
                self._down_since = self._last_failure
                log.error("pool database %s unreachable: %s", self.location, _one_line(exc))
        return PoolConnectionError(
            f"the pool database {self.location} is unreachable ({_one_line(exc)}); "
            "retry shortly"
        )

    @contextmanager
    def _tx(self, *, write: bool) -> Iterator[Any]:
        psycopg = self._psycopg
        from psycopg_pool import PoolClosed, PoolTimeout

        if self._closed:
            raise PoolError(f"pool {self.location} is closed")
        with self._down_lock:
            down, last = self._down_since, self._last_failure
        if down is not None and time.monotonic() - last < 1.0:
            raise PoolConnectionError(
                f"the pool database {self.location} is unreachable; retry shortly")
        try:
            with self._pool.connection() as conn:
                if write:
                    conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
                    conn.read_only = False
                else:
                    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                    conn.read_only = True
                with conn.transaction():
                    yield conn
        except psycopg.errors.TransactionRollback as exc:  # deadlock, serialization: not down
            raise PoolError(f"pool {self.location}: {_one_line(exc)}") from exc
        except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as exc:
            raise self._outage(exc) from exc
        except PoolClosed as exc:
            raise PoolError(f"pool {self.location} is closed") from exc
        with self._down_lock:
            if self._down_since is not None:
                log.warning("pool database %s is back after %.1f s", self.location,
                            time.monotonic() - self._down_since)
                self._down_since = None

    def _init_schema(self, conn: Any) -> None:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ADVISORY_KEY,))
            exists = conn.execute("SELECT to_regclass('meta') IS NOT NULL").fetchone()[0]
            version = SCHEMA_VERSION
            if exists:
                row = conn.execute(
                    "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                version = int(row[0]) if row else SCHEMA_VERSION
            if version > SCHEMA_VERSION:
                raise PoolSchemaError(
                    f"the pool database {self.location} has schema version {version}, newer "
                    f"than this genaug knows ({SCHEMA_VERSION}); upgrade genaug on every "
                    "replica (pip install -U genaug) or point GENAUG_POOL_URL at another "
                    "database"
                )
            for statement in _SCHEMA:
                conn.execute(statement)
            for start in range(version, SCHEMA_VERSION):
                log.warning("pool %s: upgrading schema version %d to %d in place",
                            self.location, start, start + 1)
                for statement in _UPGRADES.get(start, []):
                    conn.execute(statement)
            if exists and version < 7:
                rekey_samplers(conn.execute, "%s")
            for statement in schema_indexes():  # their columns exist by now
                conn.execute(statement)
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('schema_version', %s) ON CONFLICT (key)"
                " DO UPDATE SET value = excluded.value",
                (str(SCHEMA_VERSION),),
            )

    def sample(self, pool_id: str, labels: Sequence[str], n: int,
               rng: np.random.Generator | None = None) -> PoolSample:
        """As :meth:`PoolStore.sample` (accepted images only), in four round trips whatever the
        pool's size: the database ranks and draws (its ``random()``, so ``rng`` is not used),
        pixels come back in binary (``bytea`` as text would be hex, twice the bytes), and the
        served counts are written in one pipelined batch, counter rows locked in label order as
        every writer locks them."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        wanted = list(dict.fromkeys(labels))
        if n == 0 or not wanted:
            return empty_sample()
        with self._tx(write=True) as conn:
            rows = conn.execute(
                _SAMPLE, {"pool": pool_id, "labels": wanted, "n": n}, binary=True
            ).fetchall()
            if rows:
                served = Counter(str(row[1]) for row in rows)
                names = sorted(served)
                with conn.pipeline():
                    conn.execute(
                        "SELECT 1 FROM counters WHERE pool_id = %s AND label = ANY(%s)"
                        " ORDER BY label FOR UPDATE", (pool_id, names))
                    conn.execute(
                        "UPDATE counters SET served_total = served_total + v.k"
                        " FROM unnest(%s::text[], %s::bigint[]) AS v(label, k)"
                        " WHERE counters.pool_id = %s AND counters.label = v.label",
                        (names, [served[name] for name in names], pool_id))
                    conn.execute("UPDATE images SET served = served + 1 WHERE id = ANY(%s)",
                                 ([int(row[0]) for row in rows],))
        return decode_rows(pool_id, [row[2:] for row in rows], [str(row[1]) for row in rows])

    def _close_connections(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.close(timeout=5)

    def close(self) -> None:
        """Give back this store's reservations and close the connection pool; idempotent."""
        if getattr(self, "_pool", None) is None:
            self._closed = True
            return
        super().close()
