"""A batch of one label as :meth:`~genaug.service.pool.store.PoolStore.add` writes it: its
arrays checked and spread into one row of columns per image.

Example::

    batch = batch_rows(images, seeds, plan_indices=None, sources=None,
                       reservation=res, scores=None, keep=None)
    batch.shape                     # (h, w, c)
    batch.columns[0]                # (seed, plan index, source, score, kept) of image 0
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .types import Reservation

__all__ = ["StoredBatch", "batch_rows", "judged_flags"]


@dataclass(frozen=True)
class StoredBatch:
    """A checked batch: its contiguous pixels, ``(h, w, c)`` and each image's columns
    ``(seed, plan index or None, source hash or None, score or None, kept)``."""

    images: npt.NDArray[np.uint8]
    shape: tuple[int, int, int]
    columns: list[tuple[int, int | None, str | None, float | None, bool]]


def batch_rows(
    images: npt.NDArray[np.uint8],
    seeds: Sequence[int] | npt.NDArray[np.integer[Any]],
    *,
    plan_indices: Sequence[int] | None,
    sources: Sequence[str | None] | None,
    reservation: Reservation | None,
    scores: Sequence[float] | None,
    keep: Sequence[bool] | None,
) -> StoredBatch:
    """The batch checked (uint8 [n, h, w, c] with c 1 or 3, n of every column) with each
    image's columns; the plan indices default to the reservation's."""
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[3] not in (1, 3):
        raise ValueError(
            f"images must be uint8 [n, h, w, c] with c 1 or 3, got {images.dtype} "
            f"{list(images.shape)}"
        )
    seed_list = [int(s) for s in np.asarray(seeds).reshape(-1)]
    n, h, w, c = (int(x) for x in images.shape)
    if len(seed_list) != n:
        raise ValueError(f"{len(seed_list)} seeds for {n} images")
    if plan_indices is None and reservation is not None and n == reservation.count:
        plan_indices = reservation.indices
    index_list: list[int | None] = (
        [int(i) for i in plan_indices] if plan_indices is not None else [None] * n
    )
    source_list = list(sources) if sources is not None else [None] * n
    if len(index_list) != n or len(source_list) != n:
        raise ValueError(f"{len(index_list)} plan indices and {len(source_list)} sources "
                         f"for {n} images")
    score_list, keep_list = judged_flags(n, scores, keep)
    return StoredBatch(np.ascontiguousarray(images), (h, w, c),
                       list(zip(seed_list, index_list, source_list, score_list, keep_list,
                                strict=True)))


def judged_flags(
    n: int, scores: Sequence[float] | None, keep: Sequence[bool] | None
) -> tuple[list[float | None], list[bool]]:
    """The judge's scores and keep flags of ``n`` images, checked (None: not judged, kept)."""
    if scores is None:
        if keep is not None:
            raise ValueError("keep flags need the judge's scores (scores=...)")
        return [None] * n, [True] * n
    score_list: list[float | None] = [float(x) for x in np.asarray(scores).reshape(-1)]
    keep_list = [True] * n if keep is None else [bool(k) for k in np.asarray(keep).reshape(-1)]
    if len(score_list) != n or len(keep_list) != n:
        raise ValueError(f"{len(score_list)} scores and {len(keep_list)} keep flags for {n} "
                         "images")
    if not all(np.isfinite(x) for x in score_list if x is not None):
        raise ValueError(f"scores must be finite numbers, got {score_list}")
    return score_list, keep_list
