"""What each client operation does, step by step, written once for both clients.

An operation that takes more than one request, or waits, is a *flow*: a generator that yields
the steps to take (:class:`Send` a request, :class:`Sleep`) and is resumed with each step's
outcome. ``Client`` and ``AsyncClient`` only take the steps (``Client`` with ``httpx.Client``
and ``time.sleep``, ``AsyncClient`` with ``httpx.AsyncClient`` and ``asyncio.sleep``), through
a :class:`Run`; every decision between two steps is made here:

- :func:`send_call`: one API call (a :class:`~genaug.client._calls.Call`) on the replica
  ``_retry`` picks, a replica that failed before probed on ``/readyz`` first, retried with
  backoff within the client's ``retry_deadline``, and its answer decoded;
- :func:`wait_job`: a job polled until it ended (:class:`~genaug.client._jobs.JobWatch`
  decides when to poll and when to give up);
- :func:`wait_ready`: the replicas' ``/readyz`` polled until one is ready.

A step's outcome comes back where the flow yielded it, as a call would return or raise: the
``httpx.Response`` of a :class:`Send` (``None`` after a :class:`Sleep`), or the exception the
step raised. The flow handles ``httpx.TransportError`` (a replica gave no answer); anything
else goes on through it, its ``finally`` clauses run (a replica's outstanding count is given
back), and the client raises it.

Example::

    run = Run(send_call(base, base.calls.info()))
    while (step := run.next_step()) is not None:
        run.reply = http.request(step.method, step.url, ...)   # a Sleep: time.sleep(...)
    run.result   # the service's info, decoded
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from ._base import BaseClient
from ._calls import Call
from ._jobs import JobWatch
from ._retry import Endpoint
from .errors import GenaugError, TransportError, UnavailableError

T = TypeVar("T")

#: The HTTP timeout of :func:`probe`'s ``/readyz`` request; :func:`wait_ready`'s, and its
#: pause between rounds.
PROBE_TIMEOUT_S = 2.0
READY_TIMEOUT_S = 5.0
READY_POLL_S = 0.2


@dataclass(frozen=True)
class Send:
    """Send one request; the flow gets the ``httpx.Response``, whatever its status.
    ``content``: the body as httpx keywords (``json=`` or ``files=``); ``headers`` ``None``:
    the HTTP client's own only."""

    method: str
    url: str
    timeout: float
    headers: dict[str, str] | None = None
    content: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Sleep:
    """Wait ``seconds`` before the flow goes on."""

    seconds: float


Step = Send | Sleep
#: What a flow is resumed with: the response of a :class:`Send`, ``None`` after a
#: :class:`Sleep`.
Reply = httpx.Response | None
#: A flow that returns a ``T``. It is resumed with a :class:`Reply`, typed ``Any`` here so
#: that each ``yield Send(...)`` is annotated as the response it is.
Flow = Generator[Step, Any, T]


class Run(Generic[T]):
    """One flow taken step by step by a client: :meth:`next_step` resumes the flow with the
    last step's outcome (:attr:`reply`, or :attr:`failure`, which the flow raises where it
    yielded that step) and says the next step; ``None`` once the flow returned
    :attr:`result`.

    Example::

        run = Run(wait_job(base, watch))
        while (step := run.next_step()) is not None:
            try:
                run.reply = take(step)   # the client's I/O
            except BaseException as exc:
                run.failure = exc
        run.result   # the job, ended
    """

    result: T

    def __init__(self, flow: Flow[T]) -> None:
        self._flow = flow
        self.reply: Reply = None
        self.failure: BaseException | None = None

    def next_step(self) -> Step | None:
        reply, failure = self.reply, self.failure
        self.reply, self.failure = None, None
        try:
            return self._flow.send(reply) if failure is None else self._flow.throw(failure)
        except StopIteration as done:
            self.result = done.value
            return None


def send_call(base: BaseClient, call: Call[T]) -> Flow[T]:
    """``call``'s decoded answer: sent to the healthy replica with the fewest outstanding
    requests (one that failed before is probed first), retried on no answer, 429 and 503
    with backoff and jitter, honouring ``Retry-After``, within ``base``'s ``retry_deadline``
    (:class:`~genaug.client._retry.RetryState` raises the last error once it is spent, or at
    once for an error that is not retried)."""
    retry = base.retry_state()
    while True:
        endpoint = base.endpoints.pick()
        error: GenaugError
        if endpoint.failures:
            # It failed before: recheck readiness before sending it real work.
            refused = yield from probe(base, endpoint)
            if refused is not None:
                yield Sleep(retry.next_delay(refused, failover=base.can_fail_over()))
                continue
        endpoint.outstanding += 1
        try:
            response: httpx.Response = yield Send(
                call.method, endpoint.url + call.path, timeout=call.timeout or base.timeout,
                headers=base.headers(call.accept), content=call.content(),
            )
        except httpx.TransportError as exc:
            error = base.transport_error(exc, endpoint)
        else:
            if response.status_code < 400:
                base.endpoints.mark_up(endpoint)
                return call.decode(response.content)
            error = base.status_error(
                response.status_code, response.content, response.headers, endpoint
            )
        finally:
            endpoint.outstanding -= 1
        yield Sleep(retry.next_delay(error, failover=base.can_fail_over()))


def probe(base: BaseClient, endpoint: Endpoint) -> Flow[GenaugError | None]:
    """``None`` if ``endpoint`` answers ``/readyz`` with 200 (it is marked up), else the
    error (it rests again)."""
    try:
        response: httpx.Response = yield Send(
            "GET", endpoint.url + "/readyz", timeout=PROBE_TIMEOUT_S)
    except httpx.TransportError as exc:
        return base.transport_error(exc, endpoint)
    if response.status_code == 200:
        base.endpoints.mark_up(endpoint)
        return None
    return base.status_error(response.status_code, response.content, response.headers, endpoint)


def wait_job(base: BaseClient, watch: JobWatch) -> Flow[dict[str, Any]]:
    """``watch``'s job once it ended, polled (:func:`send_call`) as ``watch`` decides; its
    ``delay()`` raises ``TimeoutError`` at its deadline."""
    while True:
        job = yield from send_call(base, base.calls.job(watch.job_id))
        if watch.seen(job):
            return job
        yield Sleep(watch.delay())


def wait_ready(base: BaseClient, timeout: float) -> Flow[None]:
    """Returns once a replica answers ``/readyz`` with 200 (it is marked up); raises
    ``TransportError`` naming the last replica's error after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: GenaugError | None = None
    while True:
        for endpoint in base.endpoints.endpoints:
            try:
                response: httpx.Response = yield Send(
                    "GET", endpoint.url + "/readyz", timeout=READY_TIMEOUT_S)
            except httpx.TransportError as exc:
                last = base.transport_error(exc, endpoint)
                continue
            if response.status_code == 200:
                base.endpoints.mark_up(endpoint)
                return
            last = UnavailableError(
                f"{endpoint.url} is not ready yet: {response.text[:200]}", status=503,
                url=endpoint.url,
            )
        if time.monotonic() >= deadline:
            raise TransportError(f"no genaug replica became ready within {timeout:g} s: {last}")
        yield Sleep(READY_POLL_S)
