"""What trainers say they need: per recipe, per client identity, per label, decaying.

A trainer posts ``{"need": {"<label>": <number >= 0>, ...}}`` to
``POST /v1/recipes/{name}/feedback``; :class:`NeedBoard` keeps the latest report of each
client identity and combines them for the planner:

- each report is **normalised** (its values divided by their sum), so only proportions count
  and one trainer cannot outweigh another by reporting larger numbers;
- each report **decays** with a half-life (``GENAUG_NEED_HALF_LIFE_S``) from the moment it was
  posted, so a trainer that stops reporting stops steering; a report below 1/1000 of its
  weight is forgotten;
- the combination is the decay-weighted **average** of the normalised reports, times the
  weight of the freshest one: two fresh reports count half each, a stale one next to a fresh
  one little, and the whole fades to nothing once nobody renews it. Its values sum to at most
  1 (0 without feedback).

An empty report (``{"need": {}}``, or all zeros) withdraws the client's need.

A leaf: no store, no settings; the planner holds one and reads :meth:`NeedBoard.combined`.

Example::

    board = NeedBoard(half_life_s=60.0)
    board.report("digits", "trainer-a", {"3": 2.0, "8": 2.0}, now=0.0)
    board.report("digits", "trainer-b", {"3": 1.0}, now=0.0)
    board.combined("digits", ["3", "8"], now=0.0)   # {'3': 0.75, '8': 0.25}
    board.combined("digits", ["3", "8"], now=60.0)  # halved: {'3': 0.375, '8': 0.125}
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["MAX_CLIENTS_PER_RECIPE", "NeedBoard"]

#: Reports kept per recipe; past it the oldest is forgotten (client ids are the caller's).
MAX_CLIENTS_PER_RECIPE = 256
_FORGET_BELOW = 1e-3


@dataclass(frozen=True)
class _Report:
    shares: dict[str, float]  # normalised: sums to 1
    at: float


class NeedBoard:
    """The latest need of every client identity, per recipe; thread-safe.

    ``half_life_s``: how fast a report that is not renewed loses its weight.
    """

    def __init__(self, half_life_s: float) -> None:
        if not half_life_s > 0:
            raise ValueError(f"half_life_s {half_life_s} must be > 0")
        self.half_life_s = float(half_life_s)
        self._reports: dict[str, dict[str, _Report]] = {}
        self._lock = threading.Lock()

    def report(
        self, recipe: str, client: str, need: Mapping[str, float], *, now: float | None = None
    ) -> None:
        """Replace ``client``'s need for ``recipe`` (values >= 0, any scale; validated by the
        caller). All zeros or empty withdraws it."""
        now = time.monotonic() if now is None else now
        total = sum(max(0.0, float(v)) for v in need.values())
        with self._lock:
            reports = self._reports.setdefault(recipe, {})
            reports.pop(client, None)  # re-inserted last: dict order is age order
            if total > 0:
                shares = {k: max(0.0, float(v)) / total for k, v in need.items() if v > 0}
                reports[client] = _Report(shares, now)
            while len(reports) > MAX_CLIENTS_PER_RECIPE:
                reports.pop(next(iter(reports)))

    def _decay(self, report: _Report, now: float) -> float:
        return float(0.5 ** (max(0.0, now - report.at) / self.half_life_s))

    def combined(
        self, recipe: str, labels: Sequence[str], *, now: float | None = None
    ) -> dict[str, float]:
        """The fair combination of every current report, per label (see the module doc)."""
        now = time.monotonic() if now is None else now
        out = dict.fromkeys(labels, 0.0)
        with self._lock:
            reports = self._reports.get(recipe, {})
            for client in [c for c, r in reports.items() if self._decay(r, now) < _FORGET_BELOW]:
                del reports[client]
            weights = [(self._decay(r, now), r) for r in reports.values()]
        total = sum(w for w, _ in weights)
        if total <= 0:
            return out
        scale = max(w for w, _ in weights) / total
        for weight, report in weights:
            for label, share in report.shares.items():
                if label in out:
                    out[label] += weight * share * scale
        return out

    def clients(self, recipe: str, *, now: float | None = None) -> int:
        """How many client identities' reports still count for ``recipe``."""
        now = time.monotonic() if now is None else now
        with self._lock:
            reports = self._reports.get(recipe, {})
            return sum(self._decay(r, now) >= _FORGET_BELOW for r in reports.values())
