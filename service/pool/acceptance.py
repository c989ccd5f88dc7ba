"""The low-acceptance stop: the one place that counts a judged label's acceptance and stops it.

When the judge accepts under :data:`STOP_ACCEPTANCE` (10 %) of a label's images once
:data:`STOP_AFTER` (50) were judged since this process started (the pool's ``judged_total``
and ``accepted_total``, every replica's), the planner stops spending on the label: it is no
longer planned or given a fill budget. :meth:`AcceptanceStop.stopped` says why with the fix
(``GET /v1/recipes/{name}``, the status page); the log says it once. A restart (with better
shots, a longer-trained adapter or a lower ``min_score``) gives the label a new window of 50.

Example::

    stop = AcceptanceStop(["shapes"])
    stop.check("shapes", stats, judge)  # stats: LabelStats per label, read in one snapshot
    stop.stopped("shapes")  # {"circle": "stopped: the judge accepted 0 of the 50 ..."}
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from .types import LabelStats

if TYPE_CHECKING:
    from ..judge import Judge

log = logging.getLogger(__name__)

#: The low-acceptance stop: a label whose judge accepted under STOP_ACCEPTANCE of the images
#: judged since start-up, once STOP_AFTER were judged, is no longer generated.
STOP_AFTER = 50
STOP_ACCEPTANCE = 0.10


class AcceptanceStop:
    """The labels stopped per recipe, and the counts their window starts at.

    Called where the planner reads counts: planning (the batcher's idle executor) and
    ``/fill`` budgets (a route's thread). Like the planner before the split it takes no lock:
    labels are only ever added, so a race at worst notes (and logs) one stop twice."""

    def __init__(self, recipes: Iterable[str]) -> None:
        #: (judged_total, accepted_total) per (recipe, label) when first read: the window of
        #: the stop starts there.
        self._judged_at_start: dict[tuple[str, str], tuple[int, int]] = {}
        self._stopped: dict[str, dict[str, str]] = {name: {} for name in recipes}

    def stopped(self, name: str) -> dict[str, str]:
        """Labels of ``name`` the planner stopped spending on, each with why and the fix."""
        return dict(self._stopped.get(name, {}))

    def check(self, name: str, stats: Mapping[str, LabelStats], judge: Judge | None) -> None:
        """Stop labels of ``name`` whose ``judge`` accepts under :data:`STOP_ACCEPTANCE`
        (module doc); ``stats`` are the label counts just read."""
        if judge is None:
            return
        stopped = self._stopped[name]
        for label, s in stats.items():
            if label in stopped:
                continue
            start = self._judged_at_start.setdefault(
                (name, label), (s.judged_total, s.accepted_total))
            judged = s.judged_total - start[0]
            accepted = s.accepted_total - start[1]
            if judged < STOP_AFTER or accepted >= STOP_ACCEPTANCE * judged:
                continue
            stopped[label] = reason(label, judged, accepted, judge)
            log.warning("recipe %r label %r: %s", name, label, stopped[label])


def reason(label: str, judged: int, accepted: int, judge: Judge) -> str:
    """Why ``label`` stopped, and the fix, as ``GET /v1/recipes/{name}`` shows it."""
    return (
        f"stopped: the judge accepted {accepted} of the {judged} images of label "
        f"{label!r} judged since start-up ({100 * accepted / judged:.0f} %, under "
        f"{100 * STOP_ACCEPTANCE:.0f} %), so generating more would spend the device on "
        "images that are never sampled. Fix: give the judge more or better shots "
        f"(judge.shots: {judge.spec.shots}/{label}), train the label's adapter longer, "
        f"or lower judge.min_score (now {judge.min_score:g}); then restart the service")
