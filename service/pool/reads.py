"""Whole-database reads of the pool store: listing, export, plan checks, integrity.

:class:`PoolReads` composes over :class:`~genaug.service.pool.store.PoolStore`
(``store.reads.pools()``) through its units of work. These queries take no lock and count
nothing served: each reads one snapshot (``iter_images`` and ``iter_records`` one per
chunk), so they sit apart from the store's lock protocol. ``genaug pool list``, ``genaug
export`` and the tests use them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .types import PoolRecord, Provenance

if TYPE_CHECKING:
    from .unit_of_work import Units

__all__ = ["PoolReads"]

# What an export reads of each image: its pixels first (all that iter_images reads), then
# everything the pool stored about it.
_IMAGE = "i.id, i.label, i.seed, i.height, i.width, i.channels, d.data"
_RECORD = (_IMAGE + ", i.plan_index, i.created, i.model_hash, i.scheduler, i.adapter,"
           " i.adapter_scale, i.source, i.score, i.judge_keep, i.verdict, i.verdict_at,"
           " i.accepted, i.steps, i.guidance, i.strength, i.adapter_hash, i.judge_key,"
           " i.judge_settings, i.speed, i.sampler")


def _opt(value: Any, kind: type) -> Any:
    return None if value is None else kind(value)


def _pixels(data: Any, h: int, w: int, c: int) -> npt.NDArray[np.uint8]:
    return np.frombuffer(bytes(data), np.uint8).reshape(h, w, c)


class PoolReads:
    """``pools``, ``iter_images``, ``iter_records`` and ``plan_indices`` over the store's
    units of work (``store.reads``)."""

    def __init__(self, store: Units) -> None:
        self.store = store

    def pools(self) -> list[str]:
        """Every pool id in the database, sorted."""
        with self.store.unit_of_work(write=False) as uow:
            rows = uow.execute(
                "SELECT pool_id FROM counters UNION SELECT pool_id FROM images ORDER BY 1",
            ).fetchall()
        return [str(r[0]) for r in rows]

    def _chunks(
        self, pool_id: str, columns: str, *, chunk: int, include_rejected: bool
    ) -> Iterator[Sequence[Any]]:
        """``columns`` (``i.id`` first) of a pool's accepted images (with ``include_rejected``
        every image) in id order, read ``chunk`` rows per snapshot."""
        last = 0
        only = "" if include_rejected else " AND i.accepted = 1"
        while True:
            with self.store.unit_of_work(write=False) as uow:
                rows = uow.execute(
                    f"SELECT {columns} FROM images AS i JOIN image_data AS d ON d.id = i.id"
                    f" WHERE i.pool_id = ? AND i.id > ?{only} ORDER BY i.id LIMIT ?",
                    (pool_id, last, chunk),
                ).fetchall()
            if not rows:
                return
            last = int(rows[-1][0])
            yield from rows

    def iter_images(
        self, pool_id: str, *, chunk: int = 256, include_rejected: bool = False
    ) -> Iterator[tuple[str, int, npt.NDArray[np.uint8]]]:
        """Every accepted image of a pool (with ``include_rejected`` every image) as
        ``(label, seed, uint8 [h, w, c])``, without counting it served (for export)."""
        rows = self._chunks(pool_id, _IMAGE, chunk=chunk, include_rejected=include_rejected)
        for _, label, seed, h, w, c, data in rows:
            yield str(label), int(seed), _pixels(data, h, w, c)

    def iter_records(
        self, pool_id: str, *, chunk: int = 256, include_rejected: bool = False
    ) -> Iterator[PoolRecord]:
        """:meth:`iter_images` with everything the pool stored of each image (the export's
        manifest row): its plan index, model, scheduler, adapter, source, the judge's call, a
        person's verdict and its :class:`~genaug.service.pool.types.Provenance` (None for
        each field an image stored before schema 4 did not record)."""
        rows = self._chunks(pool_id, _RECORD, chunk=chunk, include_rejected=include_rejected)
        for (_, label, seed, h, w, c, data, plan_index, created, model_hash, scheduler,
             adapter, adapter_scale, source, score, judge_keep, verdict, verdict_at, accepted,
             steps, guidance, strength, adapter_hash, judge_key, judge_settings, speed,
             sampler) in rows:
            yield PoolRecord(
                label=str(label), seed=int(seed), image=_pixels(data, h, w, c),
                plan_index=_opt(plan_index, int), created=float(created),
                model_hash=str(model_hash), scheduler=str(scheduler),
                adapter=_opt(adapter, str), adapter_scale=_opt(adapter_scale, float),
                source=_opt(source, str), score=_opt(score, float),
                judge_keep=bool(judge_keep), verdict=_opt(verdict, str),
                verdict_at=_opt(verdict_at, float), accepted=bool(accepted),
                provenance=Provenance(
                    steps=_opt(steps, int), guidance=_opt(guidance, float),
                    strength=_opt(strength, float), adapter_hash=_opt(adapter_hash, str),
                    judge_key=_opt(judge_key, str),
                    judge_settings=_opt(judge_settings, str), speed=_opt(speed, str),
                    sampler=_opt(sampler, str)),
            )

    def plan_indices(self, pool_id: str) -> dict[str, list[int]]:
        """Stored plan indices per label, sorted (images added without one are left out)."""
        with self.store.unit_of_work(write=False) as uow:
            rows = uow.execute(
                "SELECT label, plan_index FROM images WHERE pool_id = ? AND plan_index IS NOT"
                " NULL ORDER BY label, plan_index",
                (pool_id,),
            ).fetchall()
        out: dict[str, list[int]] = {}
        for label, index in rows:
            out.setdefault(str(label), []).append(int(index))
        return out
