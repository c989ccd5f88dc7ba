"""The judge's stops in the pool database: one row per (pool, label), under the key it was made.

The low-acceptance stop (:mod:`~genaug.service.pool.acceptance`) is a row of ``stops``
(schema 4, beside :mod:`~genaug.service.pool.jobs`' tables), so every replica and every job
sees it. Each stop carries the key it was recorded under (the judge's settings, and the
label's adapter: :func:`~genaug.service.pool.acceptance.stop_key`); :meth:`Stops.read`
counts only stops under the key a replica runs with now, so fixing the judge (its
``min_score``, its shots) or the label's adapter and restarting clears the stop, as the
judge's fix text says. :mod:`~genaug.service.pool.stops` reads them through a cache.
``record`` and ``forget`` change only their own rows and take no label lock.

Example::

    store.stops.record(pid, "square", "stopped: ...", judge_key="3f9c0a1b2c3d4e5f")
    store.stops.read(pid, "3f9c0a1b2c3d4e5f")        # {"square": "stopped: ..."}
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .unit_of_work import Units

__all__ = ["Stops"]


class Stops:
    """``record``, ``read``, ``forget``: the judge's stops over the store's units of work
    (``store.stops``)."""

    def __init__(self, store: Units) -> None:
        self.store = store

    def record(self, pool_id: str, label: str, reason: str, judge_key: str) -> None:
        """Record that the judge stopped ``label`` (``reason`` with the fix), under
        ``judge_key``; a stop under another key is replaced, one under the same is kept."""
        with self.store.unit_of_work(write=True) as uow:
            uow.execute(
                "INSERT INTO stops (pool_id, label, reason, judge_key, stopped_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (pool_id, label) DO UPDATE SET"
                " reason = excluded.reason, judge_key = excluded.judge_key,"
                " stopped_at = excluded.stopped_at WHERE stops.judge_key <> excluded.judge_key",
                (pool_id, label, reason, judge_key, time.time()),
            )

    def read(
        self, pool_id: str, judge_key: str | Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """The pool's stopped labels with the judge's reason. With ``judge_key`` (one key, or
        one per label) only stops recorded under it: a stop under other settings is not
        one any more (a label missing from the mapping has none)."""
        with self.store.unit_of_work(write=False) as uow:
            rows = uow.execute("SELECT label, reason, judge_key FROM stops WHERE pool_id = ?"
                               " ORDER BY label", (pool_id,)).fetchall()
        out = {}
        for label, reason, key in rows:
            wanted = (judge_key.get(str(label)) if isinstance(judge_key, Mapping)
                      else judge_key)
            if judge_key is None or key == wanted:
                out[str(label)] = str(reason)
        return out

    def forget(self, pool_id: str, keys: Mapping[str, str | None]) -> int:
        """Delete the pool's stops of ``keys``' labels recorded under another key than the
        label's (None: the label has no judge now); how many. Keeps ``stops`` the truth for
        readers that do not know the keys (a scaler's query of pending work)."""
        gone = 0
        with self.store.unit_of_work(write=True) as uow:
            for label, key in sorted(keys.items()):
                gone += int(uow.execute(
                    "DELETE FROM stops WHERE pool_id = ? AND label = ?"
                    " AND (CAST(? AS TEXT) IS NULL OR judge_key <> ?)",
                    (pool_id, label, key, key)).rowcount)
        return gone
