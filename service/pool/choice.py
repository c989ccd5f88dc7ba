"""Which label pre-generation fills next: pure functions of counts, targets, demand and need.

:class:`~genaug.service.pool.planner.PoolPlanner` calls :func:`choose_label` for each recipe
and ranks every recipe's candidates by :func:`label_score`; both are unit-tested without a
pool (``tests/service/pool/test_pool.py``, ``test_pool_need.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from .types import LabelStats

__all__ = ["choose_label", "label_score"]


def choose_label(
    stats: Mapping[str, LabelStats],
    capacity: int | Mapping[str, int],
    demand: Mapping[str, float] | None = None,
    *,
    refresh_served: float | None = None,
    need: Mapping[str, float] | None = None,
    batch: int = 1,
) -> str | None:
    """The label background generation should fill next, or None when there is nothing to do.

    ``stats[label].fill`` is what counts as there (the planner passes stored + in flight).
    ``capacity`` is one number for all labels or a target per label (labels without one, or
    with 0, are never chosen). Candidates are labels below it; with ``refresh_served`` set,
    also full labels whose images were served that often on average (generating evicts the
    most-served one, so a heavily used pool keeps getting fresher and stops once it is fresh
    again). Among them the highest :func:`label_score` wins: with no demand and no need the
    emptiest label (by share of its target); with them, labels fill at rates in proportion
    to their weights ``1 + m * share_of_demand + m * need`` (``m`` the number of labels).
    Ties go to the first label in ``stats`` order. ``demand`` is in any unit (recent
    requests, images asked for); only the proportions matter. ``need`` is the trainers'
    combined need (:meth:`NeedBoard.combined`: shares summing to at most 1). ``batch``: the
    most images one batch adds to a label.

    Example::

        choose_label({"I": LabelStats(fill=10), "P": LabelStats(fill=0)}, 100)   # 'P'
        choose_label({"I": LabelStats(fill=10), "P": LabelStats(fill=20)}, 100,
                     need={"P": 1.0})                                          # 'P'
    """
    if isinstance(capacity, int) and capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    best: str | None = None
    best_score = -math.inf
    for label, s in stats.items():
        cap = capacity if isinstance(capacity, int) else capacity.get(label, 0)
        if cap < 1:
            continue  # no target for this label
        full = s.fill >= cap
        worn = (
            refresh_served is not None and s.fill > 0 and s.fill_served / s.fill >= refresh_served
        )
        if full and not worn:
            continue
        score = label_score(stats, label, cap, demand or {}, need or {}, batch=batch)
        if score > best_score:
            best, best_score = label, score
    return best


def label_score(
    stats: Mapping[str, LabelStats],
    label: str,
    capacity: int,
    demand: Mapping[str, float],
    need: Mapping[str, float],
    *,
    batch: int = 1,
) -> float:
    """How much ``label`` should be filled next: its weight ``w = 1 + m * share_of_demand +
    m * need`` over the progress it would have after its next batch, ``(fill + k) /
    capacity`` with ``k = min(batch, capacity - fill)`` (a full label, refreshed, counts as
    ``(capacity + batch) / capacity``).

    Filling the highest first is weighted fair queueing by virtual finish time: while labels
    have room, each fills at a rate in proportion to ``w`` (one trainer needing one label of
    ``m``: that label fills ``m + 1`` times faster than each other one), and with equal
    weights the emptiest goes first. The planner ranks every recipe's candidates by it.
    """
    total = sum(max(0.0, float(demand.get(k, 0.0))) for k in stats)
    share = max(0.0, float(demand.get(label, 0.0))) / total if total > 0 else 0.0
    m = len(stats)
    weight = 1.0 + m * share + m * max(0.0, float(need.get(label, 0.0)))
    fill = min(stats[label].fill, capacity)
    step = max(1, min(batch, capacity - fill)) if fill < capacity else max(1, batch)
    return weight * capacity / (fill + step)
