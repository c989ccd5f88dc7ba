"""Failover and retry, without I/O: which replica a call goes to, and how long to wait
before trying again.

:class:`Endpoints` picks the healthy replica with the fewest outstanding requests and rests
one that failed; :class:`RetryState` spaces a call's attempts (backoff with full jitter,
``Retry-After`` as a floor) within its deadline; :func:`backoff_s` is the one formula both use
(public: the trainer's feeder retries with it too).

Example::

    endpoints = Endpoints(["http://gpu-a:8000", "http://gpu-b:8000"])
    endpoint = endpoints.pick()              # where the next attempt goes
    retry = RetryState(deadline_s=30)
    delay = retry.next_delay(error)          # raises ``error`` when it is not retried
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import (
    GenaugError,
    RateLimitedError,
    StatusError,
    TransportError,
    UnavailableError,
)

RETRYABLE = (TransportError, RateLimitedError, UnavailableError)


def backoff_s(
    attempt: int, *, initial_s: float, max_s: float, jitter: float = 0.0,
    rng: random.Random | None = None,
) -> float:
    """The one backoff formula: ``initial_s * 2**(attempt - 1)`` capped at ``max_s``, times a
    uniform factor in ``[1 - jitter, 1]`` (``jitter=1``: "full jitter").

    Used by the clients' retries, their replica cooldown and the trainer's feeder. Why not a
    retry library (stamina, tenacity, backoff): none of these loops re-invokes one function.
    The client picks a replica per attempt, probes a resting one's ``/readyz``, skips the
    wait when another replica is healthy and honours ``Retry-After`` as a floor; the feeder
    never gives up, counts every failure in its stats and must stop at once when asked.
    Expressed through a library's callbacks that is more code than this, and the client
    extra (small enough for a notebook) would carry two more dependencies.

    Example::

        backoff_s(3, initial_s=0.5, max_s=30.0)   # 2.0
    """
    exp = initial_s * 2.0 ** min(max(attempt, 1) - 1, 60)
    delay = min(max_s, exp)
    if jitter:
        delay *= (rng or random).uniform(1.0 - jitter, 1.0)
    return delay


@dataclass
class Endpoint:
    """One replica: where it is, how busy we keep it, and whether it is resting after a fault."""

    url: str
    outstanding: int = 0
    down_until: float = 0.0
    failures: int = 0


class Endpoints:
    """Choose a replica per call: the healthy one with the fewest outstanding requests.

    A replica that refused a connection or answered 503 rests for a short, growing cooldown;
    after it, the client rechecks ``/readyz`` before sending it real work again. When all
    rest, the one that comes back first is tried.
    """

    def __init__(self, urls: Sequence[str]) -> None:
        if not urls:
            raise ValueError("give at least one service URL")
        self.endpoints = [Endpoint(u.rstrip("/")) for u in urls]

    def pick(self, now: float | None = None) -> Endpoint:
        now = time.monotonic() if now is None else now
        healthy = [e for e in self.endpoints if e.down_until <= now]
        if healthy:
            return min(healthy, key=lambda e: (e.outstanding, random.random()))
        return min(self.endpoints, key=lambda e: e.down_until)

    def healthy_count(self, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        return sum(e.down_until <= now for e in self.endpoints)

    def mark_down(self, endpoint: Endpoint, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        endpoint.failures += 1
        endpoint.down_until = now + backoff_s(endpoint.failures, initial_s=1.0, max_s=30.0)

    def mark_up(self, endpoint: Endpoint) -> None:
        endpoint.failures = 0
        endpoint.down_until = 0.0


class RetryState:
    """Exponential backoff with full jitter, honouring ``Retry-After``, within one deadline.

    Example::

        retry = RetryState(deadline_s=30)
        delay = retry.next_delay(error)   # raises ``error`` when it should not be retried
    """

    def __init__(self, *, deadline_s: float, base_s: float = 0.2, cap_s: float = 5.0) -> None:
        self.deadline = time.monotonic() + deadline_s
        self.deadline_s = deadline_s
        self.base_s = base_s
        self.cap_s = cap_s
        self.attempt = 0

    def next_delay(self, error: GenaugError, *, failover: bool = False) -> float:
        """Seconds to wait before the next attempt; ``failover``: another replica is healthy,
        so only ``Retry-After`` (not backoff) applies."""
        if not isinstance(error, RETRYABLE):
            raise error
        self.attempt += 1
        remaining = self.deadline - time.monotonic()
        backoff = backoff_s(self.attempt, initial_s=2 * self.base_s, max_s=self.cap_s, jitter=1.0)
        if failover:
            backoff = 0.0
        retry_after = error.retry_after if isinstance(error, StatusError) else None
        if failover and isinstance(error, UnavailableError):
            retry_after = None  # that replica is down, not this call's next one
        delay = max(backoff, retry_after or 0.0)
        if remaining <= 0 or delay > remaining:
            note = (
                f" (gave up after {self.attempt} attempts within the client's "
                f"retry_deadline of {self.deadline_s:g} s)"
            )
            if isinstance(error, StatusError):
                error.message += note
                error.args = (error.message,)
                raise error
            raise type(error)(f"{error}{note}") from error
        return delay
