"""What the generator has done, for the sharing endpoints and the status page.

Per client identity: requests, images, share of generation time, rejections, drops and
failures, and its pool samples (requests, images served, recipes) with when it was last seen
(``GET /v1/clients``), so a trainer that only samples is listed too; images per second over
the last ten minutes by source (requests or pool pre-generation); the latest images as
thumbnails (``GET /v1/recent.png``); a moving estimate of throughput for ``Retry-After``.
Plain bookkeeping on the event loop: no I/O, no threads.

Example::

    activity = Activity(metrics)
    activity.seen("trainer-a").requests += 1
    activity.sampled("trainer-b", "digits", images=64)
    activity.record(8, seconds=0.4, source="request")
    activity.throughput()   # [{"ago_s": 0.0, "source": "request", "images_per_s": 0.8, ...}]
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..metrics import Metrics
from .items import Outcome

POOL_CLIENT = "(pool pre-generation)"
HISTORY_S = 600.0
SHARE_WINDOW_S = 60.0
RECENT_IMAGES = 16
RECENT_SIDE = 128


@dataclass
class ClientStats:
    """What one client identity has asked of the generator and of the pools
    (``GET /v1/clients``).

    ``dropped`` counts requests given up (deadline passed, caller gone) before they were
    answered, once each, wherever their images were: queued, in the pipeline or paused.
    ``samples`` / ``sampled_images`` / ``sampled_recipes`` are its pool samples answered;
    ``last_seen`` the wall-clock time of its latest request of either kind."""

    requests: int = 0
    images: int = 0
    generation_s: float = 0.0
    rejected: int = 0
    dropped: int = 0
    failed: int = 0
    samples: int = 0
    sampled_images: int = 0
    # Bounded by the configured recipes: a sample is counted only once its recipe resolved.
    sampled_recipes: set[str] = field(default_factory=set)
    last_seen: float | None = None


class Activity:
    """Client accounting, throughput history and recent thumbnails of one service."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.clients: dict[str, ClientStats] = {}
        # (time, images, source) per batch over the last minutes, and the latest images.
        self.history: deque[tuple[float, int, str]] = deque()
        self.recent: deque[np.ndarray] = deque(maxlen=RECENT_IMAGES)
        self.images_per_s = 0.0  # moving estimate, for Retry-After
        # (time, client, generator seconds) per batch part over the last minute.
        self.usage: deque[tuple[float, str, float]] = deque()

    def client(self, name: str) -> ClientStats:
        return self.clients.setdefault(name, ClientStats())

    def seen(self, name: str) -> ClientStats:
        """``name`` asked something now: its stats, with ``last_seen`` moved to now."""
        stats = self.client(name)
        stats.last_seen = time.time()
        return stats

    def sampled(self, name: str, recipe: str, *, images: int) -> None:
        """``name`` was served ``images`` pool images of ``recipe`` (none is still a sample:
        a pool still filling answers fewer, and the trainer was there)."""
        stats = self.seen(name)
        stats.samples += 1
        stats.sampled_images += images
        stats.sampled_recipes.add(recipe)

    def used(self, client: str, seconds: float) -> None:
        """``client`` had the generator for ``seconds`` (its part of a batch)."""
        self.client(client).generation_s += seconds
        now = time.monotonic()
        self.usage.append((now, client, seconds))
        while self.usage and self.usage[0][0] < now - SHARE_WINDOW_S:
            self.usage.popleft()

    def recent_shares(self) -> dict[str, float]:
        """Each identity's share of generator time over the last minute (sums to 1, or
        empty when the generator did nothing then)."""
        cutoff = time.monotonic() - SHARE_WINDOW_S
        seconds: dict[str, float] = {}
        for t, client, s in self.usage:
            if t >= cutoff:
                seconds[client] = seconds.get(client, 0.0) + s
        total = sum(seconds.values())
        return {c: s / total for c, s in seconds.items()} if total > 0 else {}

    def retry_after_s(self, queued_images: int) -> int:
        """Seconds until ``queued_images`` have likely drained: for ``Retry-After``."""
        rate = self.images_per_s
        if rate <= 0:
            return 1
        return int(min(60, max(1, math.ceil(queued_images / rate))))

    def record(self, n: int, seconds: float, source: str) -> None:
        """One batch of ``n`` images took ``seconds`` (``source``: request or pool)."""
        now = time.monotonic()
        self.history.append((now, n, source))
        while self.history and self.history[0][0] < now - HISTORY_S:
            self.history.popleft()
        self.metrics.batch_images.labels(source).observe(n)
        self.metrics.images_generated.labels(source).inc(n)
        self.metrics.batch_seconds.observe(seconds)
        if seconds > 0:
            rate = n / seconds
            self.images_per_s = (
                rate if self.images_per_s == 0 else (0.8 * self.images_per_s + 0.2 * rate)
            )

    def remember(self, outcome: Outcome) -> None:
        """Keep the latest servable images as thumbnails (never failed ones)."""
        for i in outcome.good()[-RECENT_IMAGES:]:
            image = outcome.images[i]
            step = max(1, -(-max(image.shape[:2]) // RECENT_SIDE))  # thumbnails, not 1024² PNGs
            self.recent.append(np.ascontiguousarray(image[::step, ::step]))

    def throughput(self, bucket_s: float = 10.0) -> list[dict[str, float | str]]:
        """Images per second in ``bucket_s`` buckets over the last ten minutes, by source."""
        now = time.monotonic()
        wall = time.time()
        buckets: dict[tuple[int, str], int] = {}
        for t, n, source in self.history:
            index = int((now - t) // bucket_s)
            buckets[(index, source)] = buckets.get((index, source), 0) + n
        return [
            {"ago_s": index * bucket_s, "at": wall - index * bucket_s, "source": source,
             "images_per_s": count / bucket_s}
            for (index, source), count in sorted(buckets.items())
        ]
