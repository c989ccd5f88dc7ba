"""The judge's stops in the pool database: one row per (pool, label), under the key it was made.

The low-acceptance stop (:mod:`~genaug.service.pool.acceptance`) is a row of ``stops``
(schema 4, beside :mod:`~genaug.service.pool.jobs`' tables), so every replica and every job
sees it. Each stop carries the key it was recorded under (the judge's settings, and the
label's adapter: :func:`~genaug.service.pool.acceptance.stop_key`); :meth:`StopQueries.stops`
counts only stops under the key a replica runs with now, so fixing the judge (its
``min_score``, its shots) or the label's adapter and restarting clears the stop, as the
judge's fix text says. :mod:`~genaug.service.pool.stops` reads them through a cache.
``record_stop`` and ``forget_stops`` change only their own rows and take no label lock.

Example::

    store.record_stop(pid, "square", "stopped: ...", judge_key="3f9c0a1b2c3d4e5f")
    store.stops(pid, "3f9c0a1b2c3d4e5f")             # {"square": "stopped: ..."}
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

__all__ = ["StopQueries"]


class StopQueries:
    """``record_stop``, ``stops``, ``forget_stops``; mixed into
    :class:`~genaug.service.pool.store.PoolStore`."""

    if TYPE_CHECKING:  # hooks: PoolStore defines them
        def _tx(self, *, write: bool) -> AbstractContextManager[Any]: ...
        def _exec(self, conn: Any, sql: str, params: Sequence[Any] = ()) -> Any: ...

    def record_stop(self, pool_id: str, label: str, reason: str, judge_key: str) -> None:
        """Record that the judge stopped ``label`` (``reason`` with the fix), under
        ``judge_key``; a stop under another key is replaced, one under the same is kept."""
        with self._tx(write=True) as conn:
            self._exec(
                conn,
                "INSERT INTO stops (pool_id, label, reason, judge_key, stopped_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (pool_id, label) DO UPDATE SET"
                " reason = excluded.reason, judge_key = excluded.judge_key,"
                " stopped_at = excluded.stopped_at WHERE stops.judge_key <> excluded.judge_key",
                (pool_id, label, reason, judge_key, time.time()),
            )

    def stops(
        self, pool_id: str, judge_key: str | Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """The pool's stopped labels with the judge's reason. With ``judge_key`` (one key, or
        one per label) only stops recorded under it: a stop under other settings is not
        one any more (a label missing from the mapping has none)."""
        with self._tx(write=False) as conn:
            rows = self._exec(
                conn, "SELECT label, reason, judge_key FROM stops WHERE pool_id = ?"
                " ORDER BY label", (pool_id,)).fetchall()
        out = {}
        for label, reason, key in rows:
            wanted = (judge_key.get(str(label)) if isinstance(judge_key, Mapping)
                      else judge_key)
            if judge_key is None or key == wanted:
                out[str(label)] = str(reason)
        return out

    def forget_stops(self, pool_id: str, keys: Mapping[str, str | None]) -> int:
        """Delete the pool's stops of ``keys``' labels recorded under another key than the
        label's (None: the label has no judge now); how many. Keeps ``stops`` the truth for
        readers that do not know the keys (a scaler's query of pending work)."""
        gone = 0
        with self._tx(write=True) as conn:
            for label, key in sorted(keys.items()):
                gone += int(self._exec(
                    conn, "DELETE FROM stops WHERE pool_id = ? AND label = ?"
                    " AND (CAST(? AS TEXT) IS NULL OR judge_key <> ?)",
                    (pool_id, label, key, key)).rowcount)
        return gone
