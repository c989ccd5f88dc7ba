"""Pending work: the images a pool still owes what was asked of it, the figure replicas scale on.

One definition, read in two places::

    pending images of a pool = sum over its labels with a ``targets`` row and no ``stops``
    row of max(0, target - accepted images of the label in the pool)

* :data:`PENDING_SQL` reads it in the pool database, over every pool: KEDA's PostgreSQL
  trigger runs it (``docker/k8s/keda.yaml`` carries this exact text; a test checks that), so
  the replicas can scale from 0, when no replica is up to export anything.
  :data:`PENDING_BY_POOL_SQL` is the same per pool.
* :func:`pending_images` computes it from the counts the planner already read
  (:class:`~genaug.service.pool.types.LabelStats`: ``target`` is the ``targets`` row, 0
  without one, and ``fill`` counts accepted images) and the labels the judge stopped, so the
  ``genaug_pool_pending_images{recipe}`` gauge of ``/metrics`` costs no query.

What counts. Only what was *asked*: fill targets (``POST /v1/recipes/{name}/fill``, fill
jobs, samples that wait), in accepted images, as every count of the pool (module
:mod:`~genaug.service.pool.store`). Background pre-generation up to the capacity is not
pending work: it happens while replicas are up anyway and holds no GPU when nothing is asked.
Images in flight (reservations) still count: they hold a GPU until they are stored. A label
the judge stopped is not pending: no image will be made for it. Every pool in the database
counts, also one of an older recipe version that no replica serves any more: drop such a pool
(``genaug pool drop POOL_ID``) rather than leave its targets unmet.

Example::

    stats = store.stats(pid, ["circle", "square"])   # one snapshot
    pending_images(stats, stopped={"square"})        # e.g. 12
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from .types import LabelStats

__all__ = ["PENDING_BY_POOL_SQL", "PENDING_SQL", "pending_by_recipe", "pending_images"]

# Written once, for both backends (CASE, not GREATEST, which SQLite lacks), with no
# placeholder: KEDA runs the text as it is. Accepted images are counted per target row, on the
# (pool_id, label, accepted, served) index: a few milliseconds for a pool of 100,000 images.
_PENDING_PER_TARGET = (
    "SELECT c.pool_id AS pool_id,"
    " CASE WHEN c.target > c.accepted THEN c.target - c.accepted ELSE 0 END AS pending"
    " FROM (SELECT t.pool_id AS pool_id, t.target AS target,"
    " (SELECT COUNT(*) FROM images AS i WHERE i.pool_id = t.pool_id AND i.label = t.label"
    " AND i.accepted = 1) AS accepted"
    " FROM targets AS t WHERE NOT EXISTS"
    " (SELECT 1 FROM stops AS s WHERE s.pool_id = t.pool_id AND s.label = t.label)) AS c"
)

#: Pending images of every pool in the database, one integer row (0 when nothing is asked).
PENDING_SQL = (
    "SELECT CAST(COALESCE(SUM(p.pending), 0) AS BIGINT) AS pending"
    f" FROM ({_PENDING_PER_TARGET}) AS p"
)

#: Pending images per pool: rows (pool_id, pending), pools with a target only.
PENDING_BY_POOL_SQL = (
    "SELECT p.pool_id, CAST(SUM(p.pending) AS BIGINT) AS pending"
    f" FROM ({_PENDING_PER_TARGET}) AS p GROUP BY p.pool_id ORDER BY p.pool_id"
)


def pending_images(stats: Mapping[str, LabelStats], stopped: Collection[str] = ()) -> int:
    """Pending images of one pool from its labels' ``stats`` (read in one snapshot) and the
    labels the judge ``stopped``: what :data:`PENDING_SQL` counts for that pool."""
    return sum(max(0, s.target - s.fill) for label, s in stats.items() if label not in stopped)


def pending_by_recipe(
    last_stats: Mapping[str, Mapping[str, LabelStats]],
    stopped: Callable[[str], Collection[str]],
) -> dict[str, int]:
    """:func:`pending_images` per recipe from the planner's last counts
    (``PoolPlanner.last_stats``) and its stopped labels (``PoolPlanner.stopped``); recipes
    whose counts were not read yet are absent."""
    return {name: pending_images(stats, stopped(name))
            for name, stats in sorted(dict(last_stats).items())}
