"""One process's stream of pool images: a reservoir, the feeder that refills it, and counters.

Every process that draws (the process that trains, each DataLoader worker, each DDP rank's)
has its own :class:`Stream`, made the first time it iterates a dataset and kept for that
process (:func:`stream_for`): its own client, thread and reservoir, so nothing network-bound
crosses a ``fork``. Its set-up runs on a thread: read the recipe (labels, size, channels),
size the reservoir from the byte budget (at the match's shape when the config has a
:class:`~genaug.match.DomainMatch`: the feeder then matches every batch it receives before
writing it), start a :class:`~genaug.feeding.feeder.Feeder` (the feeder both trainers share)
under the client id ``<trainer>/r<rank>/w<worker>``. A draw reads the reservoir and nothing
else: it never waits on the network. A stream inherited through ``fork`` (its
thread did not come along) is replaced, and said once.

:class:`Tally` holds every process's counters in shared memory made where the dataset was
made, so the process that trains reads what its workers drew (``stats()``, ``diagnose``).

Example::

    stream = stream_for(config, tally)          # this process's, started on first use
    stream.wait_ready(deadline_s=60)            # first images, or an error naming the service
    image, label = stream.reservoir.draw_any(rng)
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import RawArray
from typing import Any

import numpy as np

from genaug.match import DomainMatch

from .identity import Place, client_id, place
from .reservoir import HostReservoir, slots_for

__all__ = ["FIELDS", "Stream", "StreamConfig", "StreamError", "Tally", "layout",
           "live_streams", "stop_stream", "stream_for"]

log = logging.getLogger(__name__)

#: Counters per process (one row each: the process that trains is row 0, worker ``w`` row
#: ``w + 1``): synthetic images handed out, real ones kept (mixing), synthetic ones asked for
#: (mixing: the coin said synthetic), of those the ones whose label is none of the recipe's
#: (mixing: kept real), fresh images received from the pool, feeder failures, iterations
#: begun (the epochs this row's process started), the bytes its reservoir holds.
FIELDS = ("synthetic", "real", "asked", "outside", "received", "failures", "iterations",
          "bytes")
_ROWS = 65


class StreamError(RuntimeError):
    """The stream cannot deliver: a configuration mistake (an unknown recipe, a refused key, a
    label the recipe lacks), or no image before the first-fill deadline. Names the service."""


@dataclass(frozen=True)
class StreamConfig:
    """What every process's stream is made from (picklable: it travels to spawned workers).

    ``label_map`` maps the recipe's label names to class indices; ``classes`` instead names
    the trainer's classes in index order, matched to the recipe's labels as ``genaug train``
    matches them (exact, else one case-insensitive match); neither: the recipe's labels in
    their order, as the TensorFlow side numbers them. ``budget_bytes`` bounds the reservoirs
    of one trainer process, split over its DataLoader workers. ``match``: the real images'
    domain; with it the reservoir holds images of its shape and every received batch is
    matched before it is written (a frozen dataclass of tuples: it pickles to workers)."""

    url: str | None
    recipe: str
    trainer: str
    label_map: Mapping[str, int] | None = None
    classes: tuple[str, ...] | None = None
    num_classes: int | None = None
    budget_bytes: int = 256 * 2**20
    batch: int = 32
    interval_s: float = 0.25
    backoff_max_s: float = 2.0
    api_key: str | None = None
    client_kwargs: Mapping[str, Any] = field(default_factory=dict)
    token: str = ""
    match: DomainMatch | None = None


class Tally:
    """Counters of every drawing process in shared memory (:data:`FIELDS`, a row each).

    Made where the dataset is made, it reaches forked and spawned DataLoader workers with the
    dataset; pickled any other way (a copy of the dataset) it starts anew, local."""

    def __init__(self) -> None:
        self._array: Any = RawArray("d", _ROWS * len(FIELDS))

    def __getstate__(self) -> dict[str, Any]:
        spawning = multiprocessing.context.get_spawning_popen() is not None
        return {"_array": self._array if spawning else None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._array = state["_array"] if state["_array"] is not None else RawArray(
            "d", _ROWS * len(FIELDS))

    @staticmethod
    def row(where: Place) -> int:
        return (where.worker + 1) % _ROWS if where.in_worker else 0

    def add(self, row: int, name: str, amount: float = 1.0) -> None:
        """Add to this process's own row (each row has one writer: no lock)."""
        self._array[row * len(FIELDS) + FIELDS.index(name)] += amount

    def set(self, row: int, name: str, value: float) -> None:
        self._array[row * len(FIELDS) + FIELDS.index(name)] = value

    def get(self, row: int, name: str) -> float:
        return float(self._array[row * len(FIELDS) + FIELDS.index(name)])

    def totals(self) -> dict[str, float]:
        """Every field summed over the processes."""
        values = np.frombuffer(self._array, dtype=np.float64).reshape(_ROWS, len(FIELDS))
        return {name: float(values[:, i].sum()) for i, name in enumerate(FIELDS)}


class Stream:
    """This process's reservoir and feeder (module doc); made by :func:`stream_for`."""

    def __init__(self, config: StreamConfig, where: Place, tally: Tally) -> None:
        self.config = config
        self.where = where
        self.tally = tally
        self.row = Tally.row(where)
        self.pid = os.getpid()
        self.client_id = client_id(config.trainer, where)
        self.reservoir: HostReservoir | None = None
        self.label_map: dict[str, int] = {}
        self.error: StreamError | None = None
        self.feeder: Any = None
        self._first = threading.Event()  # the first image arrived
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._setup, name="genaug-torch-stream",
                                        daemon=True)
        self._thread.start()

    @property
    def where_text(self) -> str:
        return self.config.url or os.environ.get("GENAUG_URL") or "the default URL"

    # -- set-up (its own thread) -------------------------------------------------------

    def _setup(self) -> None:
        try:
            detail = self._read_recipe()
            if detail is None:
                return  # stopped
            self.label_map, shape, classes = layout(self.config, detail)
            workers = max(1, self.where.workers)
            self.reservoir = HostReservoir(classes, slots_for(
                self.config.budget_bytes, num_classes=classes, image_shape=shape,
                shares=workers), shape)
            self.tally.set(self.row, "bytes", float(self.reservoir.nbytes))
            self._start_feeder()
            self._watch()
        except StreamError as exc:
            self.error = exc
        except Exception as exc:  # never let the thread die silently
            log.exception("genaug.torch stream set-up failed")
            self.error = StreamError(f"genaug.torch: the stream from {self.where_text} "
                                     f"failed: {exc}")
        finally:
            if self.error is not None:
                self._first.set()  # a waiter wakes to raise it

    def _read_recipe(self) -> Mapping[str, Any] | None:
        """The recipe's detail; outages retried (the set-up waits, draws fall back), a
        mistake raised at once."""
        from genaug.client import Client
        from genaug.feeding.preflight import is_outage

        delay = 0.25
        while not self._stop.is_set():
            try:
                with Client(self.config.url, api_key=self.config.api_key,
                            client_id=self.client_id, retry_deadline=2.0,
                            **dict(self.config.client_kwargs)) as client:
                    detail: Mapping[str, Any] = client.recipe(self.config.recipe)
                    return detail
            except Exception as exc:
                if not is_outage(exc):
                    raise StreamError(
                        f"genaug.torch: the service at {self.where_text} refused recipe "
                        f"{self.config.recipe!r}: {exc}") from None
                self.tally.add(self.row, "failures")
                self._stop.wait(delay)
                delay = min(self.config.backoff_max_s, delay * 2)
        return None

    def _start_feeder(self) -> None:
        from genaug.feeding.feeder import Feeder
        from genaug.feeding.preflight import FeederConfigError

        assert self.reservoir is not None
        self.feeder = Feeder(
            self.reservoir, url=self.config.url, recipe=self.config.recipe,
            label_map=self.label_map, batch=self.config.batch,
            interval_s=self.config.interval_s, backoff_initial_s=0.25,
            backoff_max_s=self.config.backoff_max_s, api_key=self.config.api_key,
            client_kwargs={**dict(self.config.client_kwargs), "client_id": self.client_id,
                           "retry_deadline": 2.0}, match=self.config.match)
        try:
            self.feeder.start()
        except FeederConfigError as exc:
            raise StreamError(str(exc)) from None

    def _watch(self) -> None:
        """Mirror the feeder's counters into the tally; note the first image."""
        assert self.reservoir is not None
        while not self._stop.wait(0.05):
            stats = self.feeder.stats
            self.tally.set(self.row, "received", float(self.reservoir.written))
            self.tally.set(self.row, "failures", float(stats.errors))
            if self.reservoir.written and not self._first.is_set():
                self._first.set()
            if not self.feeder.running and self.feeder.config_error is not None:
                raise StreamError(str(self.feeder.config_error))

    # -- the consumer's side ---------------------------------------------------------------

    def check(self) -> None:
        """Raise the stream's configuration error, if any (cheap: an attribute read)."""
        if self.error is not None:
            raise self.error

    def wait_ready(self, deadline_s: float) -> None:
        """Wait for the first image (at most ``deadline_s``); raise :class:`StreamError` on
        a mistake or past the deadline, naming the service."""
        if not self._first.wait(deadline_s):
            raise StreamError(
                f"genaug.torch: no image from recipe {self.config.recipe!r} at "
                f"{self.where_text} within {deadline_s:.0f} s (is the service up, and its pool "
                "filling? `genaug doctor --recipe NAME` says); raise first_fill_s to wait "
                "longer")
        self.check()

    def stop(self) -> None:
        self._stop.set()
        if self.feeder is not None:
            self.feeder.stop(timeout=5.0)


_STREAMS: dict[tuple[str, int], Stream] = {}
_LOCK = threading.Lock()
_WARNED_FORK: set[str] = set()


def stream_for(config: StreamConfig, tally: Tally) -> Stream:
    """This process's stream for ``config`` (made and started on first use). A stream made
    in a parent before it forked does not come along (its thread stayed behind): a new one
    is made here, and the fork said once."""
    pid = os.getpid()
    with _LOCK:
        found = _STREAMS.get((config.token, pid))
        if found is not None:
            return found
        inherited = [k for k in _STREAMS if k[0] == config.token and k[1] != pid]
        if inherited and config.token not in _WARNED_FORK:
            _WARNED_FORK.add(config.token)
            log.info("genaug.torch: this process (pid %d) was forked from one that had "
                     "already started a stream; it starts its own (iterate the dataset only "
                     "inside the DataLoader to spare the parent's)", pid)
        for key in inherited:
            del _STREAMS[key]
        stream = Stream(config, place(), tally)
        _STREAMS[(config.token, pid)] = stream
        return stream


def stop_stream(config: StreamConfig) -> None:
    """Stop this process's stream for ``config``, if it has one (its thread, its client)."""
    with _LOCK:
        stream = _STREAMS.pop((config.token, os.getpid()), None)
    if stream is not None:
        stream.stop()


def live_streams() -> list[Stream]:
    """The streams this process started (``diagnose``: one alive before a fork is a risk)."""
    pid = os.getpid()
    with _LOCK:
        return [s for (_, p), s in _STREAMS.items() if p == pid]


def layout(config: StreamConfig, detail: Mapping[str, Any]
           ) -> tuple[dict[str, int], tuple[int, int, int], int]:
    """``(label_map, image_shape, num_classes)`` from the recipe's detail (``GET
    /v1/recipes/{name}``) and the config (``image_shape``: the match's when it has one, else
    the recipe's); :class:`StreamError` for a map that does not fit."""
    labels = [str(x) for x in detail.get("labels") or []]
    if config.classes is not None:
        from genaug.feeding.labels import LabelMapError, match_labels

        try:
            label_map = match_labels(config.classes, labels, recipe=repr(config.recipe))
        except LabelMapError as exc:
            raise StreamError(f"genaug.torch: {exc}") from None
        return label_map, _shape(config, detail), len(config.classes)
    if config.label_map is None:
        label_map = {name: i for i, name in enumerate(labels)}
    else:
        label_map = {str(k): int(v) for k, v in config.label_map.items()}
        unknown = sorted(set(label_map) - set(labels))
        if unknown:
            raise StreamError(
                f"genaug.torch: label_map names {unknown}, which recipe {config.recipe!r} "
                f"lacks (its labels: {labels}); fix the label_map keys")
    if not label_map:
        raise StreamError(f"genaug.torch: recipe {config.recipe!r} has no labels")
    classes = config.num_classes or max(label_map.values()) + 1
    if max(label_map.values()) >= classes or min(label_map.values()) < 0:
        raise StreamError(f"genaug.torch: label_map {label_map} does not fit "
                          f"num_classes={classes}")
    return label_map, _shape(config, detail), classes


def _shape(config: StreamConfig, detail: Mapping[str, Any]) -> tuple[int, int, int]:
    """The reservoir's images: the match's ``(height, width, channels)`` when the config has
    one (what every image becomes before it is written), else the recipe's, as the pool
    stores them."""
    if config.match is not None:
        return config.match.size[0], config.match.size[1], config.match.channels
    spec = detail.get("spec") if isinstance(detail.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    h = int(spec.get("output_height") or spec.get("height") or 0)
    w = int(spec.get("output_width") or spec.get("width") or 0)
    if h < 1 or w < 1:
        raise StreamError(f"genaug.torch: recipe {config.recipe!r} names no image size")
    return h, w, int(spec.get("output_channels") or 3)


def wait_until(predicate: Any, timeout_s: float, step_s: float = 0.01) -> bool:
    """Poll ``predicate`` until true or ``timeout_s`` passed (tests and ``diagnose``)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step_s)
    return bool(predicate())
