"""The workers a pool's api sends generation to: each one that loads a model announces where
it listens and what its pools are (``workers``: one row per process), renewed with the store's
heartbeat and marked gone when it stops (kept a day, for its identity).

A worker's *identity* is what an api needs to serve that worker's pools without loading the
model: the model hash, each recipe's pool id, its judge's key and settings, each label's stop
key and the adapters' hashes (:class:`~genaug.service.pool.identity.PoolIdentity`, as JSON).
An api serves the pools of the newest worker that announced itself, alive or not, so a pool
keeps answering samples, verdicts and jobs at zero workers. A worker is *alive* while its row's
lease (the store's ``lease_s``) has not run out: a worker killed without a goodbye stops
counting one lease later.

Example::

    store.workers.announce("w-1f3c", "http://10.0.0.7:8000", "worker", identity.as_dict())
    store.workers.alive()        # [WorkerRow(id="w-1f3c", url=..., ...)]
    store.workers.newest()       # the newest row, alive or not (its identity)
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .unit_of_work import UnitOfWork, Units

__all__ = ["WorkerQueries", "WorkerRow"]

log = logging.getLogger("genaug.service.pool.store")  # the store's messages, one logger


@dataclass(frozen=True)
class WorkerRow:
    """One announced worker: its id, the URL it listens at, its role, its identity (a dict),
    when it started and until when its lease runs (seconds since the epoch)."""

    id: str
    url: str
    role: str
    identity: dict[str, Any]
    started: float
    expires: float


_COLUMNS = "id, url, role, identity, started, expires"
#: How long a gone worker's row is kept (its identity serves the pools meanwhile).
_KEPT_S = 86400.0


class WorkerQueries:
    """``announce``, ``alive`` and ``newest`` over the store's units of work
    (``store.workers``; the module doc explains them). ``lease_s``: how long a row stays
    alive without a renewal; ``hooks``: the store's heartbeat and close hook lists, which an
    announced worker joins."""

    def __init__(self, store: Units, lease_s: float, *,
                 on_renew: list[Callable[[UnitOfWork], object]],
                 on_close: list[Callable[[UnitOfWork], object]]) -> None:
        self.store = store
        self.lease_s = lease_s
        self._on_renew = on_renew
        self._on_close = on_close
        self._announced: str | None = None

    def announce(self, worker_id: str, url: str, role: str,
                 identity: Mapping[str, Any]) -> None:
        """Record this process as a worker (replacing a row of the same id); the store's
        heartbeat renews it and its close marks it gone. Rows gone for a day are deleted."""
        now = time.time()
        with self.store.unit_of_work(write=True) as uow:
            uow.execute("DELETE FROM workers WHERE expires < ?", (now - _KEPT_S,))
            uow.execute(
                "INSERT INTO workers (id, url, role, identity, started, expires) VALUES (?, ?,"
                " ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET url = excluded.url, role ="
                " excluded.role, identity = excluded.identity, expires = excluded.expires",
                (worker_id, url, role, json.dumps(dict(identity), sort_keys=True), now,
                 now + self.lease_s))
        if self._announced is None:
            self._on_renew.append(self._renew)
            self._on_close.append(self._leave)
        self._announced = worker_id
        log.info("pool: announced worker %s at %s", worker_id, url)

    def _renew(self, uow: UnitOfWork) -> None:
        uow.execute("UPDATE workers SET expires = ? WHERE id = ?",
                    (time.time() + self.lease_s, self._announced))

    def _leave(self, uow: UnitOfWork) -> None:
        uow.execute("UPDATE workers SET expires = 0 WHERE id = ?", (self._announced,))

    def alive(self) -> list[WorkerRow]:
        """The workers whose lease runs, the newest first."""
        with self.store.unit_of_work(write=False) as uow:
            rows = uow.execute(f"SELECT {_COLUMNS} FROM workers WHERE expires > ?"
                               " ORDER BY started DESC", (time.time(),)).fetchall()
        return [_row(r) for r in rows]

    def newest(self) -> WorkerRow | None:
        """The worker that started last, alive or not (None: none announced itself in the
        last day)."""
        with self.store.unit_of_work(write=False) as uow:
            got = uow.execute(f"SELECT {_COLUMNS} FROM workers ORDER BY started DESC"
                              " LIMIT 1").fetchone()
        return None if got is None else _row(got)


def _row(got: Any) -> WorkerRow:
    wid, url, role, identity, started, expires = got
    return WorkerRow(str(wid), str(url), str(role), json.loads(identity), float(started),
                     float(expires))
