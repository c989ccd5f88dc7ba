"""Which label pre-generation fills next: pure functions of counts, targets, demand and need.

:class:`~genaug.service.pool.planner.PoolPlanner` calls :func:`choose_label` for each recipe
and ranks every recipe's candidates by :func:`label_score`, whose weight is
:func:`label_weight`; :meth:`~genaug.service.pool.planner.PoolPlanner.spend` (``/fill`` with
``images``) splits a budget of images by the same weights with :func:`allocate`. All are
unit-tested without a pool (``tests/service/pool/test_pool.py``, ``test_pool_need.py``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from fractions import Fraction

from .types import LabelStats

__all__ = ["allocate", "choose_label", "label_score", "label_weight"]


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
    weight = label_weight(stats, label, demand, need)
    fill = min(stats[label].fill, capacity)
    step = max(1, min(batch, capacity - fill)) if fill < capacity else max(1, batch)
    return weight * capacity / (fill + step)


def label_weight(
    stats_or_labels: Collection[str],
    label: str,
    demand: Mapping[str, float],
    need: Mapping[str, float],
) -> float:
    """The weight ``w = 1 + m * share_of_demand + m * need`` of ``label`` among the recipe's
    ``m`` labels (``stats_or_labels``: the labels, or a mapping keyed by them).
    ``share_of_demand`` is ``label``'s share of the labels' total demand (0 without demand);
    ``need`` the trainers' combined need (shares summing to at most 1). Negative values count
    as 0. Labels fill at rates in proportion to it (:func:`label_score`), and a budget of
    images is split by it (:func:`allocate`).

    Example::

        label_weight(["a", "b"], "a", {}, {})               # 1.0
        label_weight(["a", "b"], "a", {"a": 3, "b": 1}, {})  # 2.5: 1 + 2 * 0.75
        label_weight(["a", "b"], "b", {}, {"b": 1.0})        # 3.0: 1 + 2 * 1.0
    """
    total = sum(max(0.0, float(demand.get(k, 0.0))) for k in stats_or_labels)
    share = max(0.0, float(demand.get(label, 0.0))) / total if total > 0 else 0.0
    m = len(stats_or_labels)
    return 1.0 + m * share + m * max(0.0, float(need.get(label, 0.0)))


def allocate(budget: int, room: Mapping[str, int], weights: Mapping[str, float]) -> dict[str, int]:
    """Split ``budget`` images over the labels of ``room`` in proportion to ``weights``,
    never giving a label more than its room.

    Water-filling: a label whose share would pass its room gets its room, and what it leaves
    is split over the others by their weights, until every share fits. Shares are then made
    whole by largest remainder (ties to the first label in ``room`` order), so the result
    sums to exactly ``min(budget, sum(room))``. Exact arithmetic: the same inputs always give
    the same answer. Labels with no room (0 or less) get 0; labels missing from ``weights``
    weigh 0 (they get images only once the weighed ones are full; when all weigh 0 the split
    is even). Every label of ``room`` is in the answer.

    Example::

        allocate(10, {"a": 10, "b": 2, "c": 10}, {"a": 1.0, "b": 1.0, "c": 2.0})
        # {'a': 3, 'b': 2, 'c': 5}: b is capped at 2; its 0.5 goes to a and c (1:2), giving
        # 2.67 and 5.33; the one image left after rounding down goes to a (remainder .67)
    """
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    for label, value in weights.items():
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"weight of {label!r} must be a finite number >= 0, got {value}")
    order = list(room)
    caps = {label: max(0, int(room[label])) for label in order}
    remaining = Fraction(min(budget, sum(caps.values())))
    share: dict[str, Fraction] = dict.fromkeys(order, Fraction(0))
    active = [label for label in order if caps[label] > 0]
    while active and remaining > 0:
        w = {label: Fraction(weights.get(label, 0.0)) for label in active}
        if not any(w.values()):  # only weightless labels left: an even split
            w = dict.fromkeys(active, Fraction(1))
        total = sum(w.values())
        capped = [label for label in active if remaining * w[label] / total >= caps[label]]
        if not capped:
            for label in active:
                share[label] = remaining * w[label] / total
            break
        for label in capped:
            share[label] = Fraction(caps[label])
            remaining -= caps[label]
        active = [label for label in active if label not in capped]
    out = {label: math.floor(share[label]) for label in order}
    left = int(sum(share.values())) - sum(out.values())
    by_remainder = sorted(range(len(order)),
                          key=lambda i: (-(share[order[i]] - out[order[i]]), i))
    for i in by_remainder[:left]:
        out[order[i]] += 1
    return out
