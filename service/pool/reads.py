"""Whole-database reads of the pool store: listing, export, plan checks, integrity.

:class:`PoolReads` is a mixin of :class:`~genaug.service.pool.store.PoolStore` (its methods are
the store's: ``store.pools()``). These queries take no lock and count nothing served: each
reads one snapshot (``iter_images`` one per chunk), so they sit apart from the store's lock
protocol. ``genaug pool list``, ``genaug export`` and the tests use them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

__all__ = ["PoolReads"]


class PoolReads:
    """``pools``, ``iter_images``, ``plan_indices`` and ``integrity_check``; mixed into
    :class:`~genaug.service.pool.store.PoolStore`."""

    if TYPE_CHECKING:  # hooks: PoolStore defines them
        def _tx(self, *, write: bool) -> AbstractContextManager[Any]: ...
        def _exec(self, conn: Any, sql: str, params: Sequence[Any] = ()) -> Any: ...

    def pools(self) -> list[str]:
        """Every pool id in the database, sorted."""
        with self._tx(write=False) as conn:
            rows = self._exec(
                conn,
                "SELECT pool_id FROM counters UNION SELECT pool_id FROM images ORDER BY 1",
            ).fetchall()
        return [str(r[0]) for r in rows]

    def iter_images(
        self, pool_id: str, *, chunk: int = 256, include_rejected: bool = False
    ) -> Iterator[tuple[str, int, npt.NDArray[np.uint8]]]:
        """Every accepted image of a pool (with ``include_rejected`` every image) as
        ``(label, seed, uint8 [h, w, c])``, without counting it served (for export)."""
        last = 0
        only = "" if include_rejected else " AND i.accepted = 1"
        while True:
            with self._tx(write=False) as conn:
                rows = self._exec(
                    conn,
                    "SELECT i.id, i.label, i.seed, i.height, i.width, i.channels, d.data"
                    " FROM images AS i JOIN image_data AS d ON d.id = i.id"
                    f" WHERE i.pool_id = ? AND i.id > ?{only} ORDER BY i.id LIMIT ?",
                    (pool_id, last, chunk),
                ).fetchall()
            if not rows:
                return
            for image_id, label, seed, h, w, c, data in rows:
                last = int(image_id)
                image = np.frombuffer(bytes(data), np.uint8).reshape(h, w, c)
                yield str(label), int(seed), image

    def plan_indices(self, pool_id: str) -> dict[str, list[int]]:
        """Stored plan indices per label, sorted (images added without one are left out)."""
        with self._tx(write=False) as conn:
            rows = self._exec(
                conn,
                "SELECT label, plan_index FROM images WHERE pool_id = ? AND plan_index IS NOT"
                " NULL ORDER BY label, plan_index",
                (pool_id,),
            ).fetchall()
        out: dict[str, list[int]] = {}
        for label, index in rows:
            out.setdefault(str(label), []).append(int(index))
        return out

    def integrity_check(self) -> str:
        """``"ok"`` for a sound database, else what is wrong (orphan pixels or rows)."""
        with self._tx(write=False) as conn:
            (orphans,) = self._exec(
                conn,
                "SELECT (SELECT COUNT(*) FROM image_data WHERE id NOT IN (SELECT id FROM"
                " images)) + (SELECT COUNT(*) FROM images WHERE id NOT IN (SELECT id FROM"
                " image_data))",
            ).fetchone()
        return "ok" if int(orphans) == 0 else f"{int(orphans)} images without pixels or rows"
