"""What a :class:`~genaug.feeding.feeder.Feeder`'s thread does between its
start and its stop: one request cycle, its counters, its backoff.

Each cycle asks for the labels the reservoir lacks most (:func:`wanted_labels`), fetches one
batch from the service (:func:`fetch_once`: a recipe's pool through ``sample``, or
``generate`` with a label's prompt), brings it to the real shots' domain when the feeder has a
``match`` (:class:`~genaug.match.DomainMatch`: on this thread, never in the graph) and writes
it by class. The counters are a frozen
:class:`FeederStats` that each outcome replaces (:func:`after_success`,
:func:`after_failure`); a failure waits :func:`backoff_delay` before the next try. Nothing here
holds a lock or a thread: the feeder owns both.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

__all__ = [
    "FeederStats",
    "after_failure",
    "after_success",
    "backoff_delay",
    "close_client",
    "fetch_once",
    "wanted_labels",
]

log = logging.getLogger(__name__)


class ReservoirLike(Protocol):
    """What the feeder needs of a reservoir (the TensorFlow trainer's
    :class:`~genaug.trainer.mixing.reservoir.SyntheticReservoir`, a ``genaug.torch`` stream's,
    or a stand-in)."""

    num_classes: int
    slots_per_class: int
    image_shape: tuple[int, int, int]

    def write(self, label: int, images: np.ndarray) -> int: ...
    def fill_counts(self) -> np.ndarray: ...


@dataclass(frozen=True)
class FeederStats:
    """A snapshot of a feeder's counters (see :attr:`~genaug.feeding.feeder.Feeder.stats`).

    Attributes:
        images_received: images written into the reservoir since construction.
        images_dropped: images received with a label name not in ``label_map``.
        requests: successful requests.
        errors: failed requests or writes (never raised into training).
        consecutive_failures: failures since the last success; 0 while healthy.
        connected: the last request succeeded.
        last_refresh: ``time.time()`` of the last write of at least one image, or ``None``.
        last_error: text of the most recent error, or ``None``.
        running: the feeder thread is alive.
        checked: a strict feeder's first-contact checks passed.
    """

    images_received: int = 0
    images_dropped: int = 0
    requests: int = 0
    errors: int = 0
    consecutive_failures: int = 0
    connected: bool = False
    last_refresh: float | None = None
    last_error: str | None = None
    running: bool = False
    checked: bool = False


def after_success(stats: FeederStats, *, received: int, dropped: int) -> FeederStats:
    """The counters after a request that got an answer (``received`` images written)."""
    return replace(
        stats,
        images_received=stats.images_received + received,
        images_dropped=stats.images_dropped + dropped,
        requests=stats.requests + 1,
        consecutive_failures=0,
        connected=True,
        last_refresh=time.time() if received else stats.last_refresh,
    )


def after_failure(stats: FeederStats, exc: BaseException) -> FeederStats:
    """The counters after a failed request or write."""
    return replace(
        stats,
        errors=stats.errors + 1,
        consecutive_failures=stats.consecutive_failures + 1,
        connected=False,
        last_error=f"{type(exc).__name__}: {exc}",
    )


def backoff_delay(
    failures: int, exc: BaseException | None, *, initial_s: float, max_s: float
) -> float:
    """Seconds to wait after ``failures`` failures in a row: exponential with jitter, at least
    what a 429/503 asked for (its ``retry_after``), at most ``max_s``."""
    from genaug.client import backoff_s

    # jitter: trainers don't retry in lockstep
    delay: float = backoff_s(failures, initial_s=initial_s, max_s=max_s, jitter=0.2)
    retry_after = getattr(exc, "retry_after", None)  # a 429/503 saying when to come back
    if isinstance(retry_after, int | float) and retry_after > 0:
        delay = max(delay, min(float(retry_after), max_s))
    return delay


def wanted_labels(reservoir: ReservoirLike, label_map: Mapping[str, int]) -> list[str]:
    """Label names to request: the under-filled ones, least filled first; else all."""
    fill = np.asarray(reservoir.fill_counts())
    names = sorted(label_map, key=lambda n: (int(fill[label_map[n]]), n))
    under = [n for n in names if fill[label_map[n]] < reservoir.slots_per_class]
    return under or names


async def fetch_once(
    client: Any,
    reservoir: ReservoirLike,
    *,
    wanted: list[str],
    label_map: Mapping[str, int],
    recipe: str | None,
    prompts: Mapping[str, str],
    batch: int,
    wait_s: float,
    generate_kwargs: Mapping[str, Any],
    cycle: int,
    match: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[int, int]:
    """One request, written into ``reservoir``: (images written, images dropped for a label
    not in ``label_map``). Raises the client's error when the request fails.

    With ``match`` every image written goes through it first (uint8 ``[n, h, w, C]`` of any
    size in, the reservoir's ``image_shape`` out), and ``generate`` is asked for the service's
    own size (``generate_kwargs`` may name one) rather than the reservoir's."""
    received = dropped = 0
    if recipe is not None:
        result = await client.sample(recipe, labels=wanted, n=batch, wait_s=wait_s)
        images = np.asarray(result.images)
        labels = np.asarray(result.labels)
        for i, name in enumerate(list(result.label_names)):
            mask = labels == i
            if not mask.any():
                continue
            if name not in label_map:
                dropped += int(mask.sum())
                continue
            of_label = images[mask] if match is None else match(images[mask])
            received += reservoir.write(label_map[name], of_label)
        return received, dropped
    # generate: one label per cycle, the least filled (round-robin once all are full).
    name = wanted[cycle % len(wanted)] if len(wanted) == len(label_map) else wanted[0]
    h, w, _ = reservoir.image_shape
    # Matched images are made at the generator's own size: the match frames and scales them.
    kwargs: dict[str, Any] = {} if match is not None else {"output_height": h, "output_width": w}
    kwargs.update(generate_kwargs)
    result = await client.generate(prompts[name], n=batch, **kwargs)
    images = np.asarray(result.images)
    received += reservoir.write(label_map[name], images if match is None else match(images))
    return received, dropped


async def close_client(client: Any) -> None:
    """Close a client the feeder built (``aclose`` or ``close``), at most 5 s; never raises."""
    closer = getattr(client, "aclose", None) or getattr(client, "close", None)
    if closer is None:
        return
    try:
        result = closer()
        if asyncio.iscoroutine(result):
            await asyncio.wait_for(result, timeout=5.0)
    except Exception:
        log.debug("closing the feeder's client failed", exc_info=True)
