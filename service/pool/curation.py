"""Curation queries of the pool store: a person's verdicts, the pages a person looks through.

Each image has the judge's ``score`` (NULL: not judged), the judge's keep flag ``judge_keep``
(images below the recipe's ``min_score`` are stored, counted and never sampled) and a person's
``verdict`` (NULL: none; ``reject``; ``restore``, which overrides the judge's reject). An image
is *accepted* (sampleable) iff a person restored it, or no person rejected it and the judge
kept it; the column ``accepted`` holds that, kept up to date by
:meth:`~genaug.service.pool.store.PoolStore.add` and :meth:`Curation.verdict` under the
label's lock. Everything that counts a label's fill counts accepted images only (the store's
``reserve``, ``fill``, ``stats`` and the capacity), and ``sample`` never returns a rejected
image. Rejected images (by the judge or a person) keep no room of the accepted ones; they are
bounded separately: at most ``capacity_per_label`` of them per label, the oldest evicted first,
so a label whose judge rejects most images cannot grow the pool without limit.
``counters.judged_total`` and ``counters.accepted_total`` count what the judge ever scored and
kept (lifetime: eviction does not lower them).

:class:`Curation` composes over the store (``store.curation.verdict(...)``) through its units
of work (:mod:`~genaug.service.pool.unit_of_work`). A verdict is a writer and keeps the
store's lock protocol: the label's counter lock first (the unit of work's ``locks``), then the
change and the eviction in one transaction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from .types import BrowsePage, PoolImage, VerdictResult

if TYPE_CHECKING:
    from .unit_of_work import Units

__all__ = ["BROWSE_MAX", "Curation"]

log = logging.getLogger("genaug.service.pool.store")  # the store's messages, one logger

#: Most images one :meth:`Curation.browse` page returns.
BROWSE_MAX = 500


class Curation:
    """``verdict``, ``browse`` and ``image``: the queries behind the pool page and
    ``POST /v1/recipes/{name}/verdicts``, over the store's units of work
    (``store.curation``)."""

    def __init__(self, store: Units) -> None:
        self.store = store

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
        with self.store.unit_of_work(write=True, locks={pool_id: [label]}) as uow:
            found: dict[int, list[tuple[int, bool, str | None]]] = {}
            for lo in range(0, len(wanted), uow.chunk):
                part = wanted[lo : lo + uow.chunk]
                for image_id, seed, judge_keep, verdict in uow.execute(
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
                for lo in range(0, len(ids), uow.chunk):
                    part = ids[lo : lo + uow.chunk]
                    uow.execute(
                        "UPDATE images SET verdict = ?, accepted = ?, verdict_at = ?"
                        f" WHERE id IN ({','.join('?' * len(part))})",
                        [new, accepted, now, *part],
                    )
            if updates:
                uow.evict(pool_id, label)
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
        with self.store.unit_of_work(write=False) as uow:
            (total,) = uow.execute(
                f"SELECT COUNT(*) FROM images WHERE {where}", params).fetchone()
            rows = uow.execute(
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
        with self.store.unit_of_work(write=False) as uow:
            row = uow.execute(
                "SELECT i.height, i.width, i.channels, d.data FROM images AS i JOIN image_data"
                " AS d ON d.id = i.id WHERE i.pool_id = ? AND i.label = ? AND i.seed = ?"
                " ORDER BY i.id LIMIT 1",
                (pool_id, label, int(seed)),
            ).fetchone()
        if row is None:
            return None
        h, w, c, data = row
        return np.frombuffer(bytes(data), np.uint8).reshape(int(h), int(w), int(c)).copy()
