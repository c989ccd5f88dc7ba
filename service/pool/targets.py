"""Targets and demand: how many images a label is generated up to, and how much it was asked for.

Pure and clock-injected: nothing here reads the pool or the clock; the planner
(:class:`~genaug.service.pool.planner.PoolPlanner`) passes the counts it read and ``now``.

Targets. A label's target (what it is generated up to) is the larger of what was *asked*
and, when ``pregenerate`` is on, the pool capacity, capped at the capacity (and for a label of
real images at ``images x variants_per_image``). What was asked is the larger of this
process's own (``genaug pregenerate`` in process) and the shared one in the database (raised
by ``POST /v1/recipes/{name}/fill`` and by samples that wait). Asked-for images go first: a
label below what was asked is planned before any label that is only below the capacity, so on
a pre-generating service a fill moves its images ahead of the background work.

Demand. Images asked for per label by samples, decaying with a one-minute half-life
(:class:`DemandBoard`); the planner weights labels by it (see
:func:`~genaug.service.pool.choice.label_weight`).

Example::

    limit = label_limit(capacity=100, images=None, sources=0, variants_per_image=1)  # 100
    fill_target(own=0, shared=20, limit=limit, capacity=100, pregenerate=True)  # 100
    board = DemandBoard()
    board.add("shapes", ["circle"], 8.0, now=0.0)
    board.current("shapes", ["circle"], now=60.0)  # {"circle": 4.0}
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

#: Demand halves every minute: a burst of samples steers the planner for a few minutes.
DEMAND_HALF_LIFE_S = 60.0


def label_limit(*, capacity: int, images: object | None, sources: int,
                variants_per_image: int) -> int:
    """The most a target may be: ``capacity``, and for a label of real images (``images``
    set) ``sources x variants_per_image``."""
    if images is None:
        return capacity
    return min(capacity, sources * variants_per_image)


def asked_fill(*, own: int, shared: int, limit: int) -> int:
    """The fill asked for a label (this process's ``own`` or the pool's ``shared``), capped."""
    return min(max(own, shared), limit)


def fill_target(*, own: int, shared: int, limit: int, capacity: int, pregenerate: bool) -> int:
    """The fill a label is generated up to: what was asked, or the capacity when
    pre-generating, capped at ``limit``."""
    background = capacity if pregenerate else 0
    return min(max(asked_fill(own=own, shared=shared, limit=limit), background), limit)


@dataclass
class Demand:
    """Images asked for of one label, decaying with :data:`DEMAND_HALF_LIFE_S`."""

    value: float = 0.0
    at: float = 0.0

    def add(self, amount: float, now: float) -> None:
        self.value = self.current(now) + amount
        self.at = now

    def current(self, now: float) -> float:
        if self.value == 0.0:
            return 0.0
        decay: float = 0.5 ** ((now - self.at) / DEMAND_HALF_LIFE_S)
        return self.value * decay


class DemandBoard:
    """Every (recipe, label)'s :class:`Demand`; thread-safe (samples add from the event
    loop's threads, the planner reads from a worker thread)."""

    def __init__(self) -> None:
        self._demand: dict[tuple[str, str], Demand] = {}
        self._lock = threading.Lock()

    def add(self, name: str, labels: Sequence[str], each: float, *, now: float) -> None:
        """Note that ``each`` images of each label were asked for at ``now``."""
        with self._lock:
            for label in labels:
                self._demand.setdefault((name, label), Demand()).add(each, now)

    def current(self, name: str, labels: Sequence[str], *, now: float) -> dict[str, float]:
        """Each label's demand at ``now``."""
        with self._lock:
            return {label: self._demand.get((name, label), Demand()).current(now)
                    for label in labels}
