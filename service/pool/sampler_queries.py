"""``auto``'s rows in the pool database, beside the other features' queries: each pool's
decision (``samplers``) and the tallies of judged images per sampler (``sampler_tallies``).

The tallies are counted where images are stored: :meth:`SamplerQueries.tally` listens to the
store's adds (``store.on_added``: in the add's transaction, under the label's lock), so
eviction never takes ``auto``'s evidence away and the store knows nothing of what a tally is.
:class:`~genaug.service.sampling.auto.AutoSampler` reads and writes through ``store.samplers``
(the :class:`~genaug.service.sampling.records.SamplerRecords` of the pool database); every
sampler by its :attr:`~genaug.service.sampling.modes.Sampling.id`.

Example::

    store.samplers.read(pid)                  # SamplerRow(basis, "decided", "quality:lcm:1:0")
    store.samplers.tallies(pid, judge_key)    # [(sampler, label, adapter_hash, Tally), ...]
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..sampling.modes import id_of_name
from ..sampling.records import Evidence, SamplerRow, Tally

if TYPE_CHECKING:
    from .types import AddedBatch
    from .unit_of_work import UnitOfWork, Units

__all__ = ["SamplerQueries", "rekey_samplers"]


_KEY = "pool_id = ? AND label = ? AND sampler = ? AND judge_key = ? AND adapter_hash = ?"


class SamplerQueries:
    """``read``, ``write``, ``tallies`` and the add listener ``tally`` over the store's units
    of work (``store.samplers``; the module doc explains them)."""

    def __init__(self, store: Units) -> None:
        self.store = store

    def read(self, pool_id: str) -> SamplerRow | None:
        """The pool's decision as stored, or None (never decided, or dropped)."""
        with self.store.unit_of_work(write=False) as uow:
            got = uow.execute("SELECT basis, state, sampler, reason, evidence FROM samplers"
                              " WHERE pool_id = ?", (pool_id,)).fetchone()
        if got is None:
            return None
        basis, state, sampler, reason, evidence = got
        return SamplerRow(str(basis), str(state), sampler, str(reason),
                          Evidence.from_json(evidence))

    def write(self, pool_id: str, row: SamplerRow) -> None:
        """Store ``row`` as the pool's decision (one row per pool, replaced)."""
        with self.store.unit_of_work(write=True) as uow:
            uow.execute(
                "INSERT INTO samplers (pool_id, basis, state, sampler, reason, evidence,"
                " decided) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (pool_id) DO UPDATE SET"
                " basis = excluded.basis, state = excluded.state,"
                " sampler = excluded.sampler, reason = excluded.reason,"
                " evidence = excluded.evidence, decided = excluded.decided",
                (pool_id, row.basis, row.state, row.sampler, row.reason,
                 row.evidence.to_json(), time.time()))

    def tallies(self, pool_id: str, judge_key: str) -> list[tuple[str, str, str, Tally]]:
        """``(sampler, label, adapter_hash, tally)`` of every tally under ``judge_key``."""
        with self.store.unit_of_work(write=False) as uow:
            rows = uow.execute(
                "SELECT sampler, label, adapter_hash, judged, kept, embedding FROM"
                " sampler_tallies WHERE pool_id = ? AND judge_key = ?",
                (pool_id, judge_key)).fetchall()
        return [(str(name), str(label), str(adapter),
                 Tally(int(judged), int(kept),
                       None if embedding is None else np.asarray(json.loads(embedding))))
                for name, label, adapter, judged, kept, embedding in rows]

    def tally(self, uow: UnitOfWork, added: AddedBatch) -> None:
        """The store's add listener: count a batch's judged and kept images, and add their
        summed embeddings, under its sampler, judge and adapter (nothing for a batch without
        a sampler or without judged images)."""
        made = added.provenance
        if made.sampler is None or not added.judged:
            return
        key = (added.pool_id, added.label, made.sampler, made.judge_key or "",
               made.adapter_hash or "")
        row = uow.execute(f"SELECT embedding FROM sampler_tallies WHERE {_KEY}", key).fetchone()
        total = (None if added.embedding_sum is None
                 else np.asarray(added.embedding_sum, np.float64))
        if row is not None and row[0] is not None and total is not None:
            total = total + np.asarray(json.loads(row[0]), np.float64)
        text = None if total is None else json.dumps([round(float(v), 6) for v in total])
        if row is None:
            uow.execute("INSERT INTO sampler_tallies (pool_id, label, sampler, judge_key,"
                        " adapter_hash, judged, kept, embedding) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (*key, added.judged, added.kept, text))
        else:
            uow.execute("UPDATE sampler_tallies SET judged = judged + ?, kept = kept + ?,"
                        f" embedding = ? WHERE {_KEY}", (added.judged, added.kept, text, *key))


def rekey_samplers(execute: Callable[..., Any], mark: str = "?") -> int:
    """Schema 7's upgrade: every sampler a pool names (an image's, a tally's, a decision's and
    its evidence's) from its display name, which schema 6 stored, to its stable
    :attr:`~genaug.service.sampling.modes.Sampling.id`, in the open transaction. Every image,
    tally and decision is kept; a text that is not a sampler's name stays as it is.
    ``execute``: the backend connection's, whose parameters are ``mark``. Returns the names
    rekeyed."""
    names: set[str] = set()
    for table in ("images", "sampler_tallies", "samplers"):
        names |= {str(r[0]) for r in execute(
            f"SELECT DISTINCT sampler FROM {table} WHERE sampler IS NOT NULL").fetchall()}
    ids = {name: new for name in names if (new := id_of_name(name)) is not None}
    for name, new in ids.items():
        for table in ("images", "sampler_tallies", "samplers"):
            execute(f"UPDATE {table} SET sampler = {mark} WHERE sampler = {mark}", (new, name))

    def rekey(name: str | None) -> str | None:
        return None if name is None else (id_of_name(name) or name)

    for pool_id, text in execute("SELECT pool_id, evidence FROM samplers").fetchall():
        evidence = Evidence.from_json(text)
        evidence.testing = rekey(evidence.testing)
        evidence.rejected = {rekey(k) or k: why for k, why in evidence.rejected.items()}
        evidence.wanted = {rekey(k) or k: wanted for k, wanted in evidence.wanted.items()}
        execute(f"UPDATE samplers SET evidence = {mark} WHERE pool_id = {mark}",
                (evidence.to_json(), pool_id))
    return len(ids)
