"""The judge's stops as the pool database holds them: recorded once, read by every replica.

:class:`~genaug.service.pool.acceptance.AcceptanceStop` decides that a label stops (this
replica's counts); :class:`SharedStops` records that stop in the pool (``stops``, under the
label's :func:`~genaug.service.pool.acceptance.stop_key`) and reads every replica's stops back
through a cache of :data:`STOPS_TTL_S`, so the planning loop and waiting samples do not ask
the database each time. The first read of a recipe forgets stops recorded under other keys
(settings since fixed), so the pending-work query that reads ``stops`` without keys stays
right.

Example::

    stops = SharedStops(store, {"shapes": pid}, {"shapes": {"circle": "3f9c0a1b2c3d4e5f"}})
    stops.record("shapes", "circle", "stopped: ...")
    stops.read("shapes")               # {"circle": "stopped: ..."}
    stops.read("shapes", cached=True)  # the last read, never the database (the event loop)
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..recipes.spec import Recipe
from .acceptance import judge_key, judge_settings, shots_hash, stop_key
from .store import PoolStore
from .types import PoolError

if TYPE_CHECKING:
    from ..judge import Judge

__all__ = ["STOPS_TTL_S", "SharedStops", "judge_keys"]

log = logging.getLogger(__name__)

#: Seconds the pool database's stops are reused: the planner loop and waiting samples ask
#: often, and a stop another replica recorded may wait this long to be seen.
STOPS_TTL_S = 2.0


class SharedStops:
    """Every replica's stops of ``pool_ids``' pools under ``keys`` (recipe -> label -> stop
    key; a recipe without a judge has none). Blocking unless ``cached``."""

    def __init__(self, store: PoolStore, pool_ids: Mapping[str, str],
                 keys: Mapping[str, Mapping[str, str]]) -> None:
        self.store = store
        self.pool_ids = pool_ids
        self.keys = keys
        self._read: dict[str, tuple[float, dict[str, str]]] = {}

    def read(self, name: str, *, cached: bool = False) -> dict[str, str]:
        """Labels of recipe ``name`` any replica stopped under the keys this one runs with,
        each with why and the fix (``cached``: the last read only). Through an outage, the
        last read."""
        last = self._read.get(name, (0.0, {}))
        keys = self.keys.get(name)
        if keys and not cached and time.monotonic() - last[0] >= STOPS_TTL_S:
            pid = self.pool_ids[name]
            try:
                if name not in self._read:  # once: stops of other settings go
                    self.store.stops.forget(pid, keys)
                last = (time.monotonic(), self.store.stops.read(pid, keys))
                self._read[name] = last
            except PoolError as exc:
                log.debug("could not read the pool's stops: %s", exc)
        return dict(last[1])

    def record(self, name: str, label: str, reason: str) -> None:
        """Store a stop this replica decided; read again at once, with it."""
        self.store.stops.record(self.pool_ids[name], label, reason, self.keys[name][label])
        self._read.pop(name, None)


def judge_keys(
    recipes: Mapping[str, Recipe], judges: Mapping[str, Judge], data_root: Path | None,
    adapter_hash: Callable[[Recipe, str], str | None],
) -> tuple[dict[str, tuple[str, str]], dict[str, dict[str, str]]]:
    """Per judged recipe, ``(judge key, settings JSON)`` (stored with each image it scores),
    and per label the key its stop is recorded under (the judge's, and the label's adapter:
    :func:`~genaug.service.pool.acceptance.stop_key`). Reads the shots once (their hash)."""
    made: dict[str, tuple[str, str]] = {}
    keys: dict[str, dict[str, str]] = {}
    for name, judge in judges.items():
        settings = judge_settings(judge, shots_hash(recipes[name], data_root))
        key = judge_key(settings)
        made[name] = (key, json.dumps(settings, sort_keys=True))
        keys[name] = {label: stop_key(key, adapter_hash(recipes[name], label))
                      for label in recipes[name].label_names}
    return made, keys
