"""The low-acceptance stop: the one place that counts a judged label's acceptance and stops it.

When the judge accepts under :data:`STOP_ACCEPTANCE` (10 %) of a label's images once
:data:`STOP_AFTER` (50) were judged since this process started (the pool's ``judged_total``
and ``accepted_total``, every replica's), the planner stops spending on the label: it is no
longer planned or given a fill budget. :meth:`AcceptanceStop.stopped` says why with the fix
(``GET /v1/recipes/{name}``, the status page); the log says it once.

The stop is recorded in the pool database (the ``record`` callback: the planner's
:meth:`~genaug.service.pool.jobs.JobQueries.record_stop`) under the label's
:func:`stop_key`: the judge's settings (rule, encoder, shots folder and the shots' content,
``min_score``) and the label's adapter file. Every replica and every job sees it, and a
restart with the same settings keeps it (generating more would be as futile). A restart with
better shots, a longer-trained adapter or a lower ``min_score`` runs under another key: the
old stop no longer counts and the label gets a new window of 50.

Example::

    stop = AcceptanceStop(["shapes"], record=lambda name, label, why: ...)
    stop.check("shapes", stats, judge)  # stats: LabelStats per label, read in one snapshot
    stop.stopped("shapes")  # {"circle": "stopped: the judge accepted 0 of the 50 ..."}
    judge_key(judge_settings(judge, shots_hash="ab12..."))  # "3f9c0a1b2c3d4e5f"
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..recipes.sources import resolve_shots
from ..recipes.spec import Recipe
from .types import LabelStats, PoolError

if TYPE_CHECKING:
    from ..judge import Judge

log = logging.getLogger(__name__)

#: The low-acceptance stop: a label whose judge accepted under STOP_ACCEPTANCE of the images
#: it judged since this replica started, once STOP_AFTER were judged, is no longer generated.
STOP_AFTER = 50
STOP_ACCEPTANCE = 0.10


class AcceptanceStop:
    """The labels stopped per recipe, and the counts their window starts at.

    Called where the planner reads counts: planning (the batcher's idle executor) and
    ``/fill`` budgets (a route's thread). Like the planner it takes no lock:
    labels are only ever added, so a race at worst notes (and logs) one stop twice.

    ``record(name, label, reason)`` stores a new stop for every replica; one it could not
    store (the database is down) is tried again at the next check."""

    def __init__(self, recipes: Iterable[str],
                 record: Callable[[str, str, str], None] | None = None) -> None:
        #: (judged_total, accepted_total) per (recipe, label) when first read: the window of
        #: the stop starts there.
        self._judged_at_start: dict[tuple[str, str], tuple[int, int]] = {}
        self._stopped: dict[str, dict[str, str]] = {name: {} for name in recipes}
        self._record = record
        #: Stops noted here and not yet stored in the pool database, per recipe.
        self._unrecorded: dict[str, set[str]] = {name: set() for name in self._stopped}

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
            self._unrecorded[name].add(label)
            log.warning("recipe %r label %r: %s", name, label, stopped[label])
        self._store(name)

    def _store(self, name: str) -> None:
        if self._record is None:
            return
        for label in sorted(self._unrecorded[name]):
            try:
                self._record(name, label, self._stopped[name][label])
            except PoolError as exc:  # an outage: this replica keeps it; retried next check
                log.warning("recipe %r label %r: could not record the stop in the pool "
                            "database (%s); trying again later", name, label, exc)
                return
            self._unrecorded[name].discard(label)


def reason(label: str, judged: int, accepted: int, judge: Judge,
           now: float | None = None) -> str:
    """Why ``label`` stopped, and the fix, as ``GET /v1/recipes/{name}`` shows it. The stop is
    stored and outlives the start that made it: the counts are dated (UTC, ``now``), never
    "since start-up"."""
    stamp = time.strftime("%Y-%m-%d %H:%M", time.gmtime(time.time() if now is None else now))
    return (
        f"stopped: the judge accepted {accepted} of the {judged} images of label "
        f"{label!r} it judged last, before {stamp} UTC ({100 * accepted / judged:.0f} %, under "
        f"{100 * STOP_ACCEPTANCE:.0f} %), so generating more would spend the device on "
        "images that are never sampled. Fix: give the judge more or better shots "
        f"(judge.shots: {judge.spec.shots}/{label}), train the label's adapter longer, "
        f"or lower judge.min_score (now {judge.min_score:g}); then restart the service")


def judge_settings(judge: Judge, shots_hash: str | None = None) -> dict[str, Any]:
    """The judge's settings as stored with each image it scored (``GET /v1/recipes/{name}``'s
    ``judge``, plus ``shots_hash``: the content of the shots the rule was fitted on)."""
    settings: dict[str, Any] = dict(judge.describe())
    if shots_hash is not None:
        settings["shots_hash"] = shots_hash
    return settings


def judge_key(settings: Mapping[str, Any]) -> str:
    """16 hex characters naming ``settings`` (canonical JSON): equal settings, equal keys."""
    canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def stop_key(key: str, adapter_hash: str | None) -> str:
    """The key a label's stop is recorded under: the judge's ``key`` and, for a label made
    with an adapter, the adapter file's hash (a retrained adapter is a new chance)."""
    return key if adapter_hash is None else f"{key}/{adapter_hash}"


def shots_hash(recipe: Recipe, data_root: Path | None) -> str | None:
    """A hash of the judge's shot files (names and bytes) for a ``shots`` rule, else None.
    Read once at start-up: better shots put under the same folder make another key."""
    spec = recipe.judge
    if spec is None or spec.rule != "shots":
        return None
    try:
        files = resolve_shots(spec.shots, recipe.label_names, data_root)
    except ValueError:  # the judge could not have been built either; nothing to key
        return None
    h = hashlib.sha256()
    for label in sorted(files):
        for path in files[label]:
            h.update(f"{label}\x00{path.name}\x00".encode())
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:16]
