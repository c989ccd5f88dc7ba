"""Webhooks against real receivers on 127.0.0.1: signed, once, retried, never followed, never
in the way; and the 422s of ``notify_url``.

The receivers run in threads of this process: a Starlette app under uvicorn (answers by path:
``/ok``, ``/flaky`` 500 twice then 200, ``/redirect`` 302 to ``/ok``, ``/status/<code>``)
and a raw asyncio server that accepts and never answers (or trickles one byte at a time).
Each binds port 0. The sender runs on the test's own event loop, as it will on the service's.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import numpy as np
import pytest
import uvicorn
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from genaug import __version__
from genaug.service.jobs.webhooks import WebhookSender, encode_body, sign, verify
from genaug.service.settings.notify_url import (
    RefusedUrl,
    allowed_hosts,
    check_notify_url,
    notify_url_pattern,
)

SECRET = secrets.token_hex(32)
LOGGER = "genaug.service.jobs.webhooks"
T = TypeVar("T")


# -- receivers --------------------------------------------------------------------------------


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: bytes


class Receiver:
    """A Starlette receiver under uvicorn in a thread, on 127.0.0.1:<port 0>."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        app = Starlette(routes=[Route("/{path:path}", self._answer, methods=["POST"])])
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._server = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        )
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def at(self, path: str) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.path == path]

    async def _answer(self, request: Request) -> Response:
        path = request.url.path
        body = await request.body()
        with self._lock:
            self.seen.append(Seen(path, dict(request.headers), body))
            count = sum(1 for s in self.seen if s.path == path)
        kind = path.split("/")[1]
        if kind == "flaky" and count <= 2:
            return Response("try later", status_code=500)
        if kind == "redirect":
            return Response(status_code=302, headers={"Location": "/ok" + path[len("/redirect"):]})
        if kind == "status":
            return Response(status_code=int(path.split("/")[2]))
        return Response(status_code=204)

    def __enter__(self) -> Receiver:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            assert time.monotonic() < deadline and self._thread.is_alive(), "receiver not up"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


class SilentReceiver:
    """Accepts connections and reads requests, and never answers (``trickle``: answers one
    byte every 50 ms, forever). Its own event loop, in a thread; counts connections."""

    def __init__(self, *, trickle: bool = False) -> None:
        self.trickle = trickle
        self.connections = 0
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        self._stop = self._loop.create_future()
        self._thread = threading.Thread(target=self._loop.run_until_complete,
                                        args=(self._serve(),), daemon=True)
        self._up = threading.Event()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await reader.readuntil(b"\r\n\r\n")
            if self.trickle:
                writer.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                while True:
                    writer.write(b"a")
                    await writer.drain()
                    await asyncio.sleep(0.05)
            await reader.read()  # until the sender gives up and closes
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _serve(self) -> None:
        server = await asyncio.start_server(self._handle, sock=self._sock)
        self._up.set()
        await self._stop
        server.close()
        handlers = asyncio.all_tasks() - {asyncio.current_task()}
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    def __enter__(self) -> SilentReceiver:
        self._thread.start()
        assert self._up.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set_result, None)
        self._thread.join(timeout=10)
        self._loop.close()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as live:
        yield live


def run(factory: Callable[[], Awaitable[T]], timeout: float = 30.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(factory(), timeout)

    return asyncio.run(bounded())


def job_payload() -> dict[str, Any]:
    """A job's JSON as a fill's end would carry it: a 63-bit seed drawn as the planner draws
    them, a shipped recipe's prompt, and client text with everything that needs escaping."""
    seed = int(np.random.default_rng().integers(0, 2**63 - 1))
    return {
        "id": uuid.uuid4().hex[:12],
        "kind": "fill",
        "state": "done",
        "recipe": "wound-phases",
        "per_label": {"I": 64, "P": 64, "R": 64},
        "first_seed": seed,
        "prompt": "depth map of a diabetic foot ulcer, inflammatory phase, swollen raised rim",
        "note": 'client "text"\nwith </script><script>alert(1)</script> & naïve 🦶 \u2028',
    }


async def deliver(sender: WebhookSender, url: str, payload: dict[str, Any]) -> bool:
    """Submit and wait for the result; the submit itself must return at once."""
    done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    started = time.perf_counter()
    sender.submit(url, payload, on_result=done.set_result)
    assert time.perf_counter() - started < 0.05
    assert not done.done()  # nothing happened inside submit: the POST runs in a task
    return await done


def send_one(url: str, payload: dict[str, Any], *, delivered: bool, linger_s: float = 0.0,
             **options: Any) -> WebhookSender:
    """One delivery by a fresh sender (``options``: its settings), which must end
    ``delivered`` or not; the sender is closed ``linger_s`` after that (room for a duplicate
    to arrive) and returned for its counts."""

    async def main() -> WebhookSender:
        sender = WebhookSender(SECRET, **options)
        assert await deliver(sender, url, payload) is delivered
        await asyncio.sleep(linger_s)
        await sender.aclose()
        return sender

    return run(main)


# -- delivery ---------------------------------------------------------------------------------


def test_one_delivery_arrives_once_with_a_valid_signature(receiver: Receiver) -> None:
    payload = job_payload()
    path = f"/ok/{payload['id']}"
    sender = send_one(receiver.url(path), payload, delivered=True, linger_s=0.3,
                      base_delay_s=0.05)
    (seen,) = receiver.at(path)  # exactly one
    assert (sender.delivered, sender.failed, sender.retries) == (1, 0, 0)
    expected = "sha256=" + hmac.new(SECRET.encode(), seen.body, hashlib.sha256).hexdigest()
    assert seen.headers["x-genaug-signature"] == expected
    assert verify(seen.body, SECRET, seen.headers["x-genaug-signature"])
    assert not verify(seen.body, SECRET[:-1] + "0" if SECRET[-1] != "0" else SECRET[:-1] + "1",
                      seen.headers["x-genaug-signature"])
    assert not verify(seen.body + b" ", SECRET, seen.headers["x-genaug-signature"])
    assert seen.headers["content-type"] == "application/json"
    assert seen.headers["x-genaug-event"] == "job.ended"
    assert uuid.UUID(seen.headers["x-genaug-delivery"])
    assert seen.headers["user-agent"] == f"genaug/{__version__}"
    # the receiver parses back exactly what was sent; nothing the client wrote is raw in it
    assert json.loads(seen.body) == payload
    assert seen.body == encode_body(payload)
    for raw in (b"<", b">", b"&", b"\n", "ï".encode(), "\u2028".encode()):
        assert raw not in seen.body, raw


def test_500_twice_then_200_is_three_attempts_of_one_delivery(receiver: Receiver) -> None:
    payload = job_payload()
    path = f"/flaky/{payload['id']}"
    started = time.monotonic()
    sender = send_one(receiver.url(path), payload, delivered=True, base_delay_s=0.05)
    assert time.monotonic() - started < 3
    seen = receiver.at(path)
    assert len(seen) == 3
    assert len({s.headers["x-genaug-delivery"] for s in seen}) == 1  # receivers can dedupe
    assert len({s.body for s in seen}) == 1
    assert all(verify(s.body, SECRET, s.headers["x-genaug-signature"]) for s in seen)
    assert (sender.delivered, sender.failed, sender.retries) == (1, 0, 2)


def test_a_redirect_is_not_followed_and_fails(receiver: Receiver,
                                              caplog: pytest.LogCaptureFixture) -> None:
    payload = job_payload()
    path = f"/redirect/{payload['id']}"
    url = receiver.url(path)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        sender = send_one(url, payload, delivered=False, base_delay_s=0.05, max_elapsed_s=0.5)
    assert len(receiver.at(path)) >= 2  # a 3xx is retried, like a 5xx ...
    assert receiver.at(f"/ok/{payload['id']}") == []  # ... and never followed
    assert (sender.delivered, sender.failed) == (0, 1)
    given_up = [r.getMessage() for r in caplog.records if "given up" in r.getMessage()]
    assert len(given_up) == 1 and url in given_up[0] and "302" in given_up[0], given_up


@pytest.mark.parametrize(("status", "attempts"), [(410, 1), (404, 1), (429, 3)])
def test_a_refusal_is_not_retried_and_later_is(receiver: Receiver, status: int,
                                               attempts: int) -> None:
    """410 Gone and other 4xx say the same bytes would be refused again: one attempt. 429
    says later: retried until max_elapsed_s."""
    payload = job_payload()
    path = f"/status/{status}/{payload['id']}"
    # back-off 0.2 and 0.4 s (+-20 %) fit in 1 s, a third (0.8 s more) does not
    sender = send_one(receiver.url(path), payload, delivered=False, base_delay_s=0.2,
                      max_elapsed_s=1.0)
    assert len(receiver.at(path)) == attempts
    assert (sender.failed, sender.retries) == (1, attempts - 1)


@pytest.mark.parametrize("trickle", [False, True], ids=["silent", "trickling"])
def test_a_receiver_that_never_answers_slows_nothing(trickle: bool,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """16 deliveries (twice ``concurrency``) to a receiver that accepts and never answers, or
    answers one byte every 50 ms (httpx's per-read timeout never trips): each attempt ends at
    ``timeout_s``, each delivery gives up by ``max_elapsed_s``, and an event-loop ticker
    sleeping 10 ms never waits long meanwhile."""
    timeout_s, max_elapsed_s, count = 0.3, 1.2, 16

    async def main() -> tuple[WebhookSender, list[bool], float, list[float]]:
        sender = WebhookSender(SECRET, timeout_s=timeout_s, max_elapsed_s=max_elapsed_s,
                               base_delay_s=0.05, concurrency=8)
        loop = asyncio.get_running_loop()
        results: list[asyncio.Future[bool]] = [loop.create_future() for _ in range(count)]
        gaps: list[float] = []
        ending = asyncio.Event()

        async def ticker() -> None:
            last = time.perf_counter()
            while not ending.is_set():
                await asyncio.sleep(0.01)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticking = asyncio.create_task(ticker())
        await asyncio.sleep(0.05)
        started = time.perf_counter()
        for future in results:
            sender.submit(silent.url(), job_payload(), on_result=future.set_result)
        submitted = time.perf_counter() - started
        assert submitted < 0.05, submitted
        oks = list(await asyncio.gather(*results))
        elapsed = time.perf_counter() - started
        ending.set()
        await ticking
        await sender.aclose()
        return sender, oks, elapsed, gaps

    with SilentReceiver(trickle=trickle) as silent, caplog.at_level(logging.WARNING, LOGGER):
        sender, oks, elapsed, gaps = run(main)
    assert oks == [False] * count
    assert (sender.delivered, sender.failed, sender.cancelled) == (0, count, 0)
    # every delivery tried more than once within its time: 8 at a time, 0.3 s each
    assert silent.connections >= count + 8, silent.connections
    assert elapsed < max_elapsed_s + timeout_s + 1.0, elapsed
    # the loop kept ticking: a blocking attempt would stall it for timeout_s (0.3 s)
    assert max(gaps) < 0.2, max(gaps)
    assert len(gaps) >= 0.25 * elapsed / 0.01, len(gaps)  # 40 ms a tick on average, at worst
    given_up = [r for r in caplog.records if "given up" in r.getMessage()]
    assert len(given_up) == count
    assert all(silent.url() in r.getMessage() and "timeout_s" in r.getMessage()
               for r in given_up)


def test_aclose_cancels_what_is_left_and_later_submits_fail_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    called: list[bool] = []

    async def main() -> WebhookSender:
        sender = WebhookSender(SECRET, timeout_s=5)
        for _ in range(3):
            sender.submit(silent.url(), job_payload(), on_result=called.append)
        await asyncio.sleep(0.2)
        assert sender.pending == sender.in_flight == 3
        await sender.aclose()
        assert sender.pending == sender.in_flight == 0
        sender.submit(silent.url(), job_payload(), on_result=called.append)  # never raises
        return sender

    with SilentReceiver() as silent, caplog.at_level(logging.WARNING, LOGGER):
        sender = run(main)
    assert (sender.cancelled, sender.failed, sender.delivered) == (3, 1, 0)
    assert called == [False]  # the cancelled ones stay undelivered, not failed
    messages = [r.getMessage() for r in caplog.records]
    assert any("3 delivery(ies) cancelled" in m and silent.url() in m for m in messages)
    assert any("not sent: the sender is closed" in m for m in messages)


def test_submit_never_raises_into_the_caller(receiver: Receiver) -> None:
    called: list[bool] = []
    sender = WebhookSender(SECRET)
    # no running event loop: logged and failed, not raised
    sender.submit(receiver.url("/ok/x"), job_payload(), on_result=called.append)

    async def main() -> None:
        sender.submit(receiver.url("/ok/nan"), {"score": float("nan")}, on_result=called.append)

        def broken(ok: bool) -> None:
            raise RuntimeError("the caller's bug")

        assert await deliver(sender, receiver.url("/ok/y"), job_payload()) is True
        sender.submit(receiver.url("/ok/z"), job_payload(), on_result=broken)
        while sender.pending:
            await asyncio.sleep(0.01)
        await sender.aclose()

    run(main)
    assert called == [False, False]
    assert (sender.failed, sender.delivered) == (2, 2)
    assert receiver.at("/ok/nan") == []


def test_a_sender_without_a_secret_refuses_to_start() -> None:
    for secret, words in ((None, "GENAUG_WEBHOOK_SECRET is empty"),
                          ("", "GENAUG_WEBHOOK_SECRET is empty"),
                          ("short", "GENAUG_WEBHOOK_SECRET is 5 characters, under the minimum")):
        with pytest.raises(ValueError) as raised:
            WebhookSender(secret)
        assert words in str(raised.value) and "\n" not in str(raised.value)
    assert sign(b"{}", SECRET) == "sha256=" + hmac.new(SECRET.encode(), b"{}",
                                                       hashlib.sha256).hexdigest()
    assert not verify(b"{}", SECRET, None) and not verify(b"{}", SECRET, "sha256=é")


# -- the notify_url field ----------------------------------------------------------------------

HOSTS = allowed_hosts("hooks.example.com, 127.0.0.1:8080, [fd00::1]")


@pytest.mark.parametrize(
    ("url", "hosts", "words"),
    [
        ("ftp://hooks.example.com/genaug", HOSTS, "scheme 'ftp' is not http or https"),
        ("https:///genaug", HOSTS, "has no host"),
        ("https://evil.example.com/genaug", HOSTS,
         "host evil.example.com:443 is not in GENAUG_WEBHOOK_HOSTS (hooks.example.com, "
         "127.0.0.1:8080, [fd00::1])"),
        ("http://127.0.0.1:9090/genaug", HOSTS, "host 127.0.0.1:9090 is not in"),  # port pinned
        ("http://hooks.example.com.evil.com/", HOSTS, "is not in GENAUG_WEBHOOK_HOSTS"),
        ("https://hooks.example.com/genaug", (), "webhooks are off on this service "
         "(GENAUG_WEBHOOK_HOSTS is empty"),
        ("https://hooks.example.com@evil.com/", HOSTS, "carries credentials"),
        ("https://hooks.example.com/genaug#frag", HOSTS, "has a fragment"),
        ("https://hooks.example.com/a b", HOSTS, "whitespace or control characters"),
        ("https://hooks.example.com/\r\nX-Injected: 1", HOSTS, "control characters"),
        ("https://hooks.example.com:99999/", HOSTS, "is not a valid URL"),
        ("https://hooks.example.com/" + "a" * 2100, HOSTS, "over the limit of 2048"),
    ],
)
def test_a_bad_notify_url_is_a_422_naming_field_value_and_setting(
    url: str, hosts: tuple[str, ...], words: str
) -> None:
    with pytest.raises(RefusedUrl) as raised:
        check_notify_url(url, hosts)
    message = str(raised.value)
    assert message.startswith("notify_url ") and words in message, message
    assert repr(url[:200])[:-1] in message  # the value, quoted and escaped
    assert "\n" not in message and "\r" not in message
    if "credentials" not in words and "fragment" not in words and "control" not in words \
            and "2048" not in words:
        assert "GENAUG_WEBHOOK_HOSTS" in message


@pytest.mark.parametrize(
    ("url", "normal"),
    [
        ("HTTPS://Hooks.Example.COM:443", "https://hooks.example.com/"),
        ("https://hooks.example.com.:8443/a?job=1", "https://hooks.example.com:8443/a?job=1"),
        ("http://127.0.0.1:8080/genaug", "http://127.0.0.1:8080/genaug"),
        ("http://[FD00:0::1]:9000/x", "http://[fd00::1]:9000/x"),
    ],
)
def test_an_allowed_notify_url_comes_back_normalised(url: str, normal: str) -> None:
    assert check_notify_url(url, HOSTS) == normal


def test_the_host_list_parses_and_refuses_in_one_line() -> None:
    assert allowed_hosts("") == allowed_hosts(" , ") == ()
    assert allowed_hosts("Hooks.Example.com., [FD00::1]:8080, ::1, hooks.example.com") == (
        "hooks.example.com", "[fd00::1]:8080", "[::1]")
    for bad in ("https://hooks.example.com", "hooks.example.com:0", "hooks example", "[h]:80",
                "h:port", "/path"):
        with pytest.raises(ValueError) as raised:
            allowed_hosts(bad)
        assert f"GENAUG_WEBHOOK_HOSTS entry {bad!r}" in str(raised.value)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_every_url_the_served_pattern_admits_passes_the_webhooks_check(data: Any) -> None:
    """The fill schema's ``notify_url`` pattern (what a generated client or a fuzzer may send)
    is a subset of what :func:`check_notify_url` accepts: a schema-valid request is never
    refused."""
    hosts = allowed_hosts("127.0.0.1, hooks.example.com:8443, [fd00::1], genaug_hook, "
                          "plain.example:80")
    pattern = notify_url_pattern(hosts)
    url = data.draw(st.from_regex(pattern, fullmatch=True).filter(lambda u: len(u) <= 2048))
    assert check_notify_url(url, hosts)


# -- the job loop: attempts counted, one window across restarts -------------------------------


def _ended_job(jobs: Any, url: str) -> Any:
    """A done job of ``jobs``' one recipe whose webhook is pending."""
    job = jobs.queries.create(jobs.planner.pool_ids["shapes"], "shapes", "per_label",
                              {"circle": 1}, notify_url=url)
    assert jobs.queries.set_state(job.id, "done")
    return job


def test_the_job_loop_counts_each_attempt_and_keeps_one_window_across_restarts(
        receiver: Receiver, tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    """``webhook.attempts`` is the POSTs made (a flaky receiver: 3), not the claims (1); and a
    delivery whose first attempt was longer ago than the window (a restart cut it off) makes
    no new attempt after a restart: it fails, saying why, as docs/webhooks.md says."""
    from genaug.service.jobs.fill_jobs import FillJobs
    from genaug.service.jobs.loop import JobLoop
    from genaug.service.jobs.webhooks import MAX_ELAPSED_S
    from genaug.service.pool.open import open_pool
    from genaug.service.pool.planner import PoolPlanner
    from genaug.service.recipes.spec import LabelSpec, Recipe

    recipe = Recipe(name="shapes", labels={"circle": LabelSpec(prompts=["a circle"])},
                    height=32, width=32, steps=2, guidance=3.0)
    path = f"/flaky/{uuid.uuid4().hex[:8]}"
    with open_pool(tmp_path / "pool.db", capacity_per_label=10) as store:
        jobs = FillJobs(PoolPlanner({"shapes": recipe}, store, model_hash="m",
                                    pregenerate=False))
        job = _ended_job(jobs, receiver.url(path))
        late = _ended_job(jobs, receiver.url(f"/ok/{uuid.uuid4().hex[:8]}"))
        jobs.attempted(late.id, time.time() - MAX_ELAPSED_S - 5)  # an earlier run's

        async def main() -> None:
            loop = JobLoop(jobs, WebhookSender(SECRET, base_delay_s=0.05), poll_s=0.05)
            await loop.once()
            deadline = time.monotonic() + 20
            while any((j := jobs.queries.get(i)) is None or j.webhook_state == "pending"
                      for i in (job.id, late.id)):
                assert time.monotonic() < deadline, jobs.queries.recent()
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.1)  # the attempts' own records land
            await loop.stop()

        with caplog.at_level(logging.WARNING, logger=LOGGER):
            run(main)
        done, given_up = jobs.queries.get(job.id), jobs.queries.get(late.id)
    assert done is not None and given_up is not None
    assert len(receiver.at(path)) == 3
    assert (done.webhook_state, done.webhook_attempts) == ("delivered", 3)
    assert done.webhook_first is not None and abs(done.webhook_first - time.time()) < 30
    assert (given_up.webhook_state, given_up.webhook_attempts) == ("failed", 1)
    assert not receiver.at(urlsplit(given_up.notify_url or "").path)  # no new attempt
    assert "beyond max_elapsed_s=180" in caplog.text, caplog.text
