"""One transaction of the pool database, as the features that compose over the store see it.

:class:`~genaug.service.pool.store.PoolStore` is the database (connections, transactions,
schema, the counting protocol). The features beside it (a person's curation, the judge's
stops, whole-pool reads, the recipes' specs, and above the pool the fill jobs,
:mod:`genaug.service.jobs`) are objects that hold the store and do their work in a
:class:`UnitOfWork` it opens (:meth:`~genaug.service.pool.store.PoolStore.unit_of_work`):
their statements, in the backend's dialect, inside one transaction, with the labels' counter
locks taken first, in the store's one order (sorted), so a feature's writer never deadlocks
with the store's own. Nothing here is private to the store: a feature needs no hook into it.

Example::

    with store.unit_of_work(write=True, locks={pid: ["circle", "square"]}) as uow:
        rows = uow.execute("SELECT label, target FROM targets WHERE pool_id = ?", (pid,))
        uow.execute(f"UPDATE targets SET target = {uow.greatest}(target, ?) WHERE ...", ...)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["UnitOfWork", "Units"]


class Units(Protocol):
    """What a feature holds of the store: the units of work it opens (a
    :class:`~genaug.service.pool.store.PoolStore` is one). Typed this way, a feature depends
    on this module, not on the store that holds it."""

    def unit_of_work(self, *, write: bool, locks: Mapping[str, Sequence[str]] | None = None
                     ) -> AbstractContextManager[UnitOfWork]: ...


@dataclass(frozen=True)
class UnitOfWork:
    """What a feature may do inside one transaction of the pool database.

    ``now`` is the database's SQL for "now" in seconds since the epoch, ``greatest`` its
    two-argument maximum, ``chunk`` how many ids one ``IN (...)`` list may hold. Made by the
    store only (:meth:`~genaug.service.pool.store.PoolStore.unit_of_work`), over its
    connection and its statement, lock and eviction functions."""

    _conn: Any
    _execute: Callable[[Any, str, Sequence[Any]], Any]
    _lock: Callable[[Any, str, str], int]
    _evict: Callable[[Any, str, str], int]
    now: str
    greatest: str
    chunk: int

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run ``sql`` (written with ``?`` placeholders) in this transaction; its cursor."""
        return self._execute(self._conn, sql, params)

    def lock(self, pool_id: str, label: str) -> int:
        """Take ``label``'s counter lock (made if new) until the transaction ends; its
        ``next_index``. :meth:`~genaug.service.pool.store.PoolStore.unit_of_work` takes the
        locks it was given, in order, before anything else: call this only for a label that
        sorts after those."""
        return self._lock(self._conn, pool_id, label)

    def evict(self, pool_id: str, label: str) -> int:
        """Bring ``label`` back to the pool's capacity, as the counting protocol does after
        an add (under its lock); how many images went."""
        return self._evict(self._conn, pool_id, label)
