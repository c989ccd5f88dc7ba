"""Drawing a sample: how many images each label gives, and the stored rows made into one batch.

Both backends choose rows their own way (SQLite in Python with the caller's ``rng``,
PostgreSQL in one ranked query) and then share these two steps: :func:`spread` splits ``n``
over the labels as evenly as their images allow, and :func:`decode_rows` turns the rows a
sample fetched into the :class:`~genaug.service.pool.types.PoolSample` it returns.

Example::

    spread(5, [10, 1, 10], rng)                # [2, 1, 2]
    decode_rows(pool_id, rows, labels)         # PoolSample(images [n, h, w, c], labels, seeds)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .types import PoolError, PoolSample

__all__ = ["decode_rows", "empty_sample", "spread"]


def empty_sample() -> PoolSample:
    """A sample of no images."""
    return PoolSample(np.empty((0, 0, 0, 3), np.uint8), [], np.empty((0,), np.int64))


def decode_rows(pool_id: str, rows: Sequence[Sequence[Any]], labels: Sequence[str]) -> PoolSample:
    """The sample made of ``rows``, each ``(seed, height, width, channels, source, data)``
    with ``data`` the pixels' bytes (``bytes``, ``memoryview`` or ``bytearray``), and
    ``labels[i]`` the label of ``rows[i]``.

    Raises :class:`~genaug.service.pool.types.PoolError` (one line, with the fix) when the
    rows disagree on their shape: a pool id pins one output shape.
    """
    if not rows:
        return empty_sample()
    h, w, c = (int(v) for v in rows[0][1:4])
    out = np.empty((len(rows), h, w, c), np.uint8)
    seeds = np.empty((len(rows),), np.int64)
    sources: list[str | None] = []
    for j, (seed, hh, ww, cc, source, data) in enumerate(rows):
        if (hh, ww, cc) != (h, w, c):
            raise PoolError(
                f"pool {pool_id} holds images of different shapes ({h}x{w}x{c} and "
                f"{hh}x{ww}x{cc}); a pool id must pin one output shape: run "
                f"`genaug pool drop {pool_id}` and let it be generated again"
            )
        out[j] = np.frombuffer(bytes(data), np.uint8).reshape(h, w, c)
        seeds[j] = seed
        sources.append(source)
    return PoolSample(out, list(labels), seeds, sources if any(sources) else None)


def spread(n: int, available: Sequence[int], rng: np.random.Generator) -> list[int]:
    """Split ``n`` over bins holding ``available`` items as evenly as they allow.

    Water-filling: equal shares, a bin that runs out gives its remainder to the others; the
    last indivisible remainder goes to randomly chosen bins (so no label is always favoured).
    """
    alloc = [0] * len(available)
    remaining = n
    while remaining > 0:
        open_bins = [i for i, a in enumerate(available) if alloc[i] < a]
        if not open_bins:
            break
        share = remaining // len(open_bins)
        if share == 0:
            for i in rng.choice(open_bins, size=remaining, replace=False):
                alloc[int(i)] += 1
            break
        for i in open_bins:
            give = min(share, available[i] - alloc[i])
            alloc[i] += give
            remaining -= give
    return alloc
