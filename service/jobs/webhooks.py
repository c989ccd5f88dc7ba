"""Webhooks: tell a receiver, once and signed, that a job ended, without slowing generation.

A fill may carry ``notify_url``; when its job ends the service POSTs the job's JSON there.

- **Only hosts an operator allowed.** The fill's request model checks ``notify_url`` once,
  when the fill arrives, with the one rule in :mod:`~genaug.service.settings.notify_url` (an
  ``http``/``https`` URL whose host is listed in ``GENAUG_WEBHOOK_HOSTS``); the sender only
  sends to URLs that passed it. The list is empty by default, and then every ``notify_url``
  is refused: webhooks are off until an operator names a receiver.
- **Signed.** ``X-Genaug-Signature: sha256=<hex HMAC-SHA256 of the body>`` under
  ``GENAUG_WEBHOOK_SECRET`` (:func:`sign`), as GitHub's ``X-Hub-Signature-256``; receivers
  check it with :func:`verify` or the five lines in docs/webhooks.md.
- **Once, retried.** :class:`WebhookSender` delivers from background tasks on the service's
  event loop; ``X-Genaug-Delivery`` (the job's id) stays the same on every retry so a
  receiver can drop a duplicate. Redirects are never followed.
- **Never in the way.** :meth:`WebhookSender.submit` returns at once and never raises; each
  attempt is bounded in time (a receiver that trickles bytes too), a semaphore bounds the
  attempts in flight, and response bodies are never read. Generation runs on the worker
  thread, so a receiver that hangs costs the event loop only sockets that wait
  (bench/service/webhook_overhead.py measures it).

Example, on the service's event loop::

    url = body.notify_url                                  # checked at intake
    sender = WebhookSender(secret)                         # once, in the lifespan
    sender.submit(url, job_json, on_result=mark_notified)  # when the job ends
    await sender.aclose()                                  # at shutdown

From another thread: ``loop.call_soon_threadsafe(partial(sender.submit, url, job_json))``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from genaug import __version__

from ..settings.notify_url import HOSTS_SETTING, SECRET_SETTING
from ..settings.values import MIN_SECRET_CHARS

log = logging.getLogger(__name__)

#: ``X-Genaug-Event`` of a job's end, the one event there is.
JOB_ENDED = "job.ended"
#: 4xx answers that say "later" rather than "never": retried like 5xx.
RETRIED_4XX = frozenset({408, 429})
#: WebhookSender's defaults: an attempt's bound, attempts at once, a delivery's bound.
TIMEOUT_S = 10.0
CONCURRENCY = 8
MAX_ELAPSED_S = 180.0

# -- the signature -----------------------------------------------------------------------------


def sign(body: bytes, secret: str) -> str:
    """``X-Genaug-Signature``: ``"sha256="`` + the hex HMAC-SHA256 of ``body`` under
    ``secret`` (UTF-8), the form of GitHub's ``X-Hub-Signature-256``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(body: bytes, secret: str, header: str | None) -> bool:
    """Whether ``header`` (``X-Genaug-Signature`` as received, or ``None``) signs ``body``
    (the raw bytes, before any JSON parsing) under ``secret``; in constant time, for
    receivers."""
    if not header:
        return False
    received = header.strip().encode("utf-8", "replace")
    return hmac.compare_digest(sign(body, secret).encode(), received)


def encode_body(payload: Mapping[str, Any]) -> bytes:
    """The bytes a webhook sends: compact JSON, keys sorted, ASCII only, and ``<``, ``>`` and
    ``&`` as ``\\u003c`` ``\\u003e`` ``\\u0026``, so nothing a client sent (a prompt, a label)
    arrives unescaped even at a receiver that pastes the body into HTML. JSON has those three
    characters only inside strings, where the escapes mean the same. NaN is refused
    (``ValueError``): it is not JSON, and strict parsers reject it."""
    text = json.dumps(payload, separators=(",", ":"), sort_keys=True, ensure_ascii=True,
                      allow_nan=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .encode("ascii"))


# -- delivery ---------------------------------------------------------------------------------


class WebhookSender:
    """Deliver webhooks from background tasks on the running event loop.

    ``submit`` returns at once. Each delivery POSTs its body (:func:`encode_body`) with
    ``Content-Type: application/json``, ``X-Genaug-Signature``, ``X-Genaug-Event``,
    ``X-Genaug-Delivery`` (the same on every retry: the job's id, or a UUID) and
    ``User-Agent: genaug/<version>``.

    - A 2xx answer is delivered. Redirects are never followed (a 3xx is a failed attempt: the
      allowlist was checked against this URL, not the one a receiver points to).
    - Timeouts (``timeout_s`` for the whole attempt, however the receiver trickles), connection
      errors, 3xx, 5xx, 408 and 429 are retried after ``base_delay_s``, then twice as long each
      time (jittered by +-20 %, capped at ``max_delay_s``; a longer ``Retry-After`` in seconds
      is honoured up to the cap) while the next attempt can start within ``max_elapsed_s`` of
      the first; then the delivery is given up, logged once with the URL and the last error.
    - Other 4xx (400, 401, 403, 404, 410 Gone, 413, 422 ...) give up at once: the receiver
      refused this body or this signature, and the same bytes would be refused again.
    - At most ``concurrency`` attempts run at once (waiting ones queue, retries included); at
      most ``max_pending`` deliveries are kept, past that a submit fails at once (logged).
    - ``on_result(True|False)`` is called once when a delivery ends (its exceptions are
      logged, never raised); not for deliveries that :meth:`aclose` cancels, which stay
      undelivered and may be submitted again after a restart.

    A secret is required (``ValueError`` otherwise): the issue promises signed webhooks, and an
    unsigned one would let anyone who can reach a receiver forge a job's end; so a service with
    ``GENAUG_WEBHOOK_HOSTS`` set and no ``GENAUG_WEBHOOK_SECRET`` refuses to start, in one
    line, rather than send what receivers cannot trust. The HTTP client ignores the proxy and
    ``.netrc`` environment (``trust_env=False``): no credentials of the service's host travel.

    Counters for metrics (plain attributes): ``delivered``, ``failed``, ``retries`` (attempts
    after a first), ``cancelled`` (by :meth:`aclose`); gauges :attr:`pending` and
    :attr:`in_flight`. Example::

        sender = WebhookSender(secret, max_elapsed_s=180)
        sender.submit("https://hooks.example.com/genaug", {"id": "j1", "state": "done"})
        ...
        await sender.aclose()
    """

    def __init__(
        self,
        secret: str | None,
        *,
        timeout_s: float = TIMEOUT_S,
        max_elapsed_s: float = MAX_ELAPSED_S,
        concurrency: int = CONCURRENCY,
        base_delay_s: float = 1.0,
        max_delay_s: float = 60.0,
        max_pending: int = 10_000,
    ) -> None:
        if not secret:
            raise ValueError(
                f"webhooks need a signing secret: {SECRET_SETTING} is empty while "
                f"{HOSTS_SETTING} allows hosts; set {SECRET_SETTING} to at least "
                f"{MIN_SECRET_CHARS} random characters (python -c 'import secrets; "
                f"print(secrets.token_hex(32))'), or empty {HOSTS_SETTING} to turn webhooks off"
            )
        if len(secret) < MIN_SECRET_CHARS:
            raise ValueError(
                f"{SECRET_SETTING} is {len(secret)} characters, under the minimum of "
                f"{MIN_SECRET_CHARS}; set it to a longer random string (python -c 'import "
                f"secrets; print(secrets.token_hex(32))')"
            )
        for name, value in (("timeout_s", timeout_s), ("max_elapsed_s", max_elapsed_s),
                            ("concurrency", concurrency), ("base_delay_s", base_delay_s),
                            ("max_delay_s", max_delay_s), ("max_pending", max_pending)):
            if not value > 0:
                raise ValueError(f"WebhookSender {name}={value!r} must be over 0")
        self._secret = secret
        self._timeout_s = float(timeout_s)
        self._max_elapsed_s = float(max_elapsed_s)
        self._base_delay_s = float(base_delay_s)
        self._max_delay_s = float(max_delay_s)
        self._max_pending = max_pending
        self._semaphore = asyncio.Semaphore(concurrency)
        self._client = httpx.AsyncClient(
            follow_redirects=False,
            timeout=self._timeout_s,
            trust_env=False,
            limits=httpx.Limits(max_connections=concurrency,
                                max_keepalive_connections=concurrency),
            headers={"User-Agent": f"genaug/{__version__}"},
        )
        self._tasks: dict[asyncio.Task[None], str] = {}
        self._closed = False
        self._attempting = 0
        self.delivered = 0
        self.failed = 0
        self.retries = 0
        self.cancelled = 0

    @property
    def pending(self) -> int:
        """Deliveries not yet ended: in an attempt, waiting for one, or backing off."""
        return len(self._tasks)

    @property
    def in_flight(self) -> int:
        """Attempts under way now (at most ``concurrency``)."""
        return self._attempting

    def submit(
        self,
        url: str,
        payload: Mapping[str, Any],
        *,
        on_result: Callable[[bool], None] | None = None,
        event: str = JOB_ENDED,
        delivery: str | None = None,
        first_attempt_at: float | None = None,
        on_attempt: Callable[[float], None] | None = None,
    ) -> None:
        """Deliver ``payload`` to ``url`` (already checked at intake) in the background;
        returns at once and never raises. Call it on the event loop's thread.
        ``delivery``: the ``X-Genaug-Delivery`` id (default a new UUID; the job loop passes the
        job's id, so a delivery sent again after a restart carries the same one).
        ``first_attempt_at``: when an earlier run made this delivery's first attempt (seconds
        since the epoch): the window of ``max_elapsed_s`` runs from it, so a delivery resumed
        after a restart never starts an attempt later than one that was never cut off.
        ``on_attempt(started_at)`` is called as each attempt starts (its exceptions logged)."""
        try:
            if self._closed:
                raise RuntimeError("the sender is closed (the service is stopping)")
            if len(self._tasks) >= self._max_pending:
                raise RuntimeError(f"{len(self._tasks)} deliveries pending, the limit "
                                   f"(max_pending={self._max_pending})")
            body = encode_body(payload)
            delivery = delivery or str(uuid.uuid4())
            task = asyncio.get_running_loop().create_task(
                self._deliver(url, body, delivery, event, on_result, first_attempt_at,
                              on_attempt),
                name=f"webhook-{delivery}",
            )
        except Exception as exc:  # the caller is ending a job: a webhook must not fail it
            self.failed += 1
            log.warning("webhook to %s not sent: %s", url, exc)
            _report(on_result, False)
            return
        self._tasks[task] = url
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)

    async def _deliver(
        self,
        url: str,
        body: bytes,
        delivery: str,
        event: str,
        on_result: Callable[[bool], None] | None,
        first_attempt_at: float | None = None,
        on_attempt: Callable[[float], None] | None = None,
    ) -> None:
        headers = {
            "Content-Type": "application/json",
            "X-Genaug-Event": event,
            "X-Genaug-Delivery": delivery,
            "X-Genaug-Signature": sign(body, self._secret),
        }
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self._max_elapsed_s
        if first_attempt_at is not None:  # resumed: the window runs from the first attempt
            deadline -= max(0.0, time.time() - first_attempt_at)
        attempts = 0
        error: str | None = None
        retry_after: float | None
        if loop.time() > deadline:
            self.failed += 1
            log.warning("webhook %s to %s given up: its first attempt was %.0f s ago, beyond "
                        "max_elapsed_s=%g", delivery, url, time.time() - (first_attempt_at or 0),
                        self._max_elapsed_s)
            _report(on_result, False)
            return
        while True:
            async with self._semaphore:
                if attempts and loop.time() > deadline:  # waited for a turn past the end
                    error = f"{error}; then no turn free before max_elapsed_s"
                    retried, retry_after = False, None
                else:
                    attempts += 1
                    _tell(on_attempt, time.time())
                    self._attempting += 1
                    try:
                        error, retried, retry_after = await self._attempt(url, body, headers)
                    finally:
                        self._attempting -= 1
                    if error is None:
                        self.delivered += 1
                        _report(on_result, True)
                        return
            delay = self._delay(attempts - 1, retry_after)
            if not retried or loop.time() + delay > deadline:
                self.failed += 1
                log.warning("webhook %s to %s given up after %d attempt(s) in %.1f s: %s",
                            delivery, url, attempts, loop.time() - started, error)
                _report(on_result, False)
                return
            self.retries += 1
            log.debug("webhook %s to %s: %s; retry in %.2f s", delivery, url, error, delay)
            await asyncio.sleep(delay)

    async def _attempt(
        self, url: str, body: bytes, headers: dict[str, str]
    ) -> tuple[str | None, bool, float | None]:
        """One POST: ``(error or None, whether to retry, Retry-After seconds or None)``."""
        try:
            # The whole attempt is bounded: httpx's timeouts are per read, and a receiver that
            # trickles one byte a second would never trip them.
            async with asyncio.timeout(self._timeout_s):
                async with self._client.stream("POST", url, content=body,
                                               headers=headers) as response:
                    # The body is never read: a receiver cannot make the service buffer it.
                    status = response.status_code
                    retry_after = _retry_after(response.headers.get("Retry-After"))
        except TimeoutError:
            return f"no answer within timeout_s={self._timeout_s:g}", True, None
        except httpx.TransportError as exc:
            return f"{type(exc).__name__}: {exc or 'connection failed'}", True, None
        except Exception as exc:  # an invalid URL, say: retrying would not mend it
            return f"{type(exc).__name__}: {exc}", False, None
        if 200 <= status < 300:
            return None, False, None
        if 300 <= status < 400:
            location = response.headers.get("Location", "")
            return f"HTTP {status} to {location!r} (redirects are not followed)", True, None
        retried = status >= 500 or status in RETRIED_4XX
        return f"HTTP {status}", retried, retry_after

    def _delay(self, retry: int, retry_after: float | None) -> float:
        """Back-off before retry number ``retry + 1``: base x 2^retry, +-20 %, capped; at
        least the receiver's ``Retry-After`` (capped too)."""
        delay = min(self._max_delay_s, self._base_delay_s * 2.0 ** min(retry, 32))
        delay = min(self._max_delay_s, delay * random.uniform(0.8, 1.2))
        if retry_after is not None:
            delay = max(delay, min(retry_after, self._max_delay_s))
        return delay

    async def aclose(self) -> None:
        """Cancel the deliveries not yet ended (logged with their count and URLs), close the
        connections; later submits fail (logged). Call it once, on the loop that submitted."""
        self._closed = True
        pending = dict(self._tasks)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
            self.cancelled += len(pending)
            urls = sorted(set(pending.values()))
            log.warning("webhooks: %d delivery(ies) cancelled at shutdown, undelivered: %s",
                        len(pending), ", ".join(urls[:5]) + (" ..." if len(urls) > 5 else ""))
        await self._client.aclose()


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds; ``None`` when absent or an HTTP date (rare for webhooks)."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def _tell(on_attempt: Callable[[float], None] | None, at: float) -> None:
    if on_attempt is None:
        return
    try:
        on_attempt(at)
    except Exception:
        log.exception("webhook on_attempt callback failed")


def _report(on_result: Callable[[bool], None] | None, ok: bool) -> None:
    if on_result is None:
        return
    try:
        on_result(ok)
    except Exception:  # the caller's callback: its failure is its own, logged here
        log.exception("webhook on_result callback failed")
