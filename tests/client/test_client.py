"""Client and AsyncClient against real uvicorn services running the tiny pipeline.

Retries, failover and error translation are exercised end to end; replica choice and backoff
bounds are unit-tested on ``_retry`` and ``_base`` (no I/O, no sleeping).
"""

from __future__ import annotations

import asyncio
import io
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from genaug.client import (
    AsyncClient,
    AuthenticationError,
    Client,
    DecodeError,
    GenerateResult,
    InvalidRequestError,
    RateLimitedError,
    TransportError,
    UnavailableError,
)
from genaug.client._base import BaseClient
from genaug.client._results import decode_generate, decode_sample
from genaug.client._retry import Endpoint, Endpoints, RetryState
from genaug.local_service import free_port
from genaug.wire import encode_batch

KINDS = ["sync", "async"]


def call(
    kind: str, url: Any, method: str, *args: Any, client: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """``Client(url, **client).method(*args, **kwargs)`` for either client kind."""
    options = client or {}
    if kind == "sync":
        with Client(url, **options) as client:
            return getattr(client, method)(*args, **kwargs)

    async def main() -> Any:
        async with AsyncClient(url, **options) as client:
            return await getattr(client, method)(*args, **kwargs)

    return asyncio.run(main())


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there once the probe closes


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.monotonic()
    result = fn()
    return result, time.monotonic() - started


# -- generate, PNG, info, readiness ----------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_generate_returns_images_seeds_and_metadata(service: Any, kind: str) -> None:
    result = call(kind, service.url, "generate", "a red circle", n=3, seed=21, height=32,
                  width=32, steps=2)
    assert isinstance(result, GenerateResult) and len(result) == 3
    assert result.images.dtype == np.uint8 and result.images.shape == (3, 32, 32, 3)
    assert result.seeds.dtype == np.int64 and result.seeds.tolist() == [21, 22, 23]
    assert result.metadata["request"]["prompt"] == "a red circle"
    assert result.metadata["resolved"]["steps"] == 2
    model_hash = httpx.get(service.url + "/v1/info").json()["model"]["hash"]
    assert result.metadata["model_hash"] == model_hash


def test_sync_and_async_clients_agree_and_seed_matters(service: Any) -> None:
    options = {"n": 2, "seed": 7, "height": 32, "width": 32, "steps": 2}
    sync = call("sync", service.url, "generate", "a green square", **options)
    async_ = call("async", service.url, "generate", "a green square", **options)
    np.testing.assert_array_equal(sync.images, async_.images)
    assert not np.array_equal(sync.images[0], sync.images[1])  # seed 7 vs seed 8


@pytest.mark.parametrize("kind", KINDS)
def test_generate_png(service: Any, kind: str) -> None:
    png = call(kind, service.url, "generate_png", "x", n=1, seed=1, output_height=24,
               output_width=40)
    assert isinstance(png, bytes) and png.startswith(b"\x89PNG\r\n\x1a\n")
    image = Image.open(io.BytesIO(png))
    assert image.size == (40, 24) and image.mode == "RGB"


@pytest.mark.parametrize("kind", KINDS)
def test_info(service: Any, kind: str) -> None:
    info = call(kind, service.url, "info")
    assert info["ready"] is True
    assert info["model"]["kind"] == "tiny-random" and len(info["model"]["hash"]) == 16
    assert info["limits"]["max_batch_images"] == 8


@pytest.mark.parametrize("kind", KINDS)
def test_wait_ready_on_a_live_service_returns(service: Any, kind: str) -> None:
    _, elapsed = timed(lambda: call(kind, service.url, "wait_ready", timeout=10))
    assert elapsed < 5


@pytest.mark.parametrize("kind", KINDS)
def test_wait_ready_on_a_closed_port_says_how_to_start_a_service(kind: str) -> None:
    url = dead_url()
    started = time.monotonic()
    with pytest.raises(TransportError) as caught:
        call(kind, url, "wait_ready", timeout=0.5)
    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert "genaug serve" in message and url in message


# -- retries and failover --------------------------------------------------------------------


def generate_logging_attempts(
    kind: str, url: str, log: list[tuple[float, str, Any]], prompt: str, **kwargs: Any
) -> Any:
    """``generate`` with httpx event hooks that log each attempt and answer, with times."""

    def on_request(request: httpx.Request) -> None:
        log.append((time.monotonic(), "request", None))

    def on_response(response: httpx.Response) -> None:
        log.append((time.monotonic(), str(response.status_code),
                    response.headers.get("retry-after")))

    if kind == "sync":
        with Client(url, retry_deadline=30) as client:
            client._http.event_hooks = {"request": [on_request], "response": [on_response]}
            return client.generate(prompt, **kwargs)

    async def main() -> Any:
        async def a_request(request: httpx.Request) -> None:
            on_request(request)

        async def a_response(response: httpx.Response) -> None:
            on_response(response)

        async with AsyncClient(url, retry_deadline=30) as client:
            client._http.event_hooks = {"request": [a_request], "response": [a_response]}
            return await client.generate(prompt, **kwargs)

    return asyncio.run(main())


@pytest.mark.parametrize("kind", KINDS)
def test_429_is_retried_after_retry_after_then_succeeds(make_service: Any, kind: str) -> None:
    live = make_service(max_batch_images=1, max_queue_images=2, max_wait_ms=0)
    live.worker.gate.clear()
    held: dict[str, int] = {}

    def fill() -> None:
        held["status"] = httpx.post(live.url + "/v1/generate", json={"prompt": "hold", "n": 2},
                                    timeout=60).status_code

    filler = threading.Thread(target=fill)
    filler.start()
    release = threading.Timer(0.3, live.worker.gate.set)
    log: list[tuple[float, str, Any]] = []
    try:
        assert live.worker.entered.wait(10)  # one image in the worker, one queued
        release.start()
        result = generate_logging_attempts(kind, live.url, log, "patient", n=2, seed=3)
    finally:
        live.worker.gate.set()
        release.cancel()
        filler.join(30)
    assert result.seeds.tolist() == [3, 4] and result.images.shape == (2, 64, 64, 3)
    assert held["status"] == 200
    assert live.metric("genaug_rejections_total", 'reason="queue_full"') >= 1
    events = [event for _, event, _ in log]
    assert events[:2] == ["request", "429"] and events[-1] == "200", events
    # Each retry after a 429 waited at least its Retry-After (backoff alone is < 0.5 s).
    for (at, event, retry_after), (next_at, next_event, _) in zip(log, log[1:], strict=False):
        if event == "429":
            assert next_event == "request"
            assert retry_after is not None and float(retry_after) >= 1
            assert next_at - at >= float(retry_after) - 0.05, log


@pytest.mark.parametrize("kind", KINDS)
def test_429_past_the_retry_deadline_raises_rate_limited(make_service: Any, kind: str) -> None:
    live = make_service(max_batch_images=1, max_queue_images=2, max_wait_ms=0)
    live.worker.gate.clear()
    filler = threading.Thread(target=lambda: httpx.post(
        live.url + "/v1/generate", json={"prompt": "hold", "n": 2}, timeout=60))
    filler.start()
    try:
        assert live.worker.entered.wait(10)
        with pytest.raises(RateLimitedError) as caught:
            call(kind, live.url, "generate", "impatient", n=2, client={"retry_deadline": 0.5})
    finally:
        live.worker.gate.set()
        filler.join(30)
    error = caught.value
    assert error.status == 429 and error.error_type == "queue_full"
    assert error.retry_after is not None and error.retry_after >= 1
    assert "retry_deadline" in str(error)


@pytest.mark.parametrize("kind", KINDS)
def test_refused_replica_fails_over_to_the_next(service: Any, kind: str) -> None:
    dead = dead_url()
    if kind == "sync":
        with Client([dead, service.url], retry_deadline=10) as client:
            # Make the dead replica the least busy one so that it is tried first.
            client._base.endpoints.endpoints[1].outstanding = 1
            result, elapsed = timed(lambda: client.generate("x", seed=5, steps=1))
            endpoints = client._base.endpoints.endpoints
    else:

        async def main() -> tuple[Any, float, list[Endpoint]]:
            async with AsyncClient([dead, service.url], retry_deadline=10) as client:
                client._base.endpoints.endpoints[1].outstanding = 1
                started = time.monotonic()
                result = await client.generate("x", seed=5, steps=1)
                return result, time.monotonic() - started, client._base.endpoints.endpoints

        result, elapsed, endpoints = asyncio.run(main())
    assert result.seeds.tolist() == [5]
    assert endpoints[0].failures == 1 and endpoints[0].down_until > time.monotonic()
    assert endpoints[1].failures == 0
    assert endpoints[0].outstanding == 0 and endpoints[1].outstanding == 1  # all returned
    assert elapsed < 5  # no backoff sleep while another replica is healthy


@pytest.mark.parametrize("kind", KINDS)
def test_all_replicas_dead_raises_after_the_retry_deadline(kind: str) -> None:
    urls = [dead_url(), dead_url()]
    started = time.monotonic()
    with pytest.raises(TransportError) as caught:
        call(kind, urls, "generate", "x", client={"retry_deadline": 1.0})
    elapsed = time.monotonic() - started
    assert elapsed < 5
    message = str(caught.value)
    assert "retry_deadline of 1 s" in message and "genaug serve" in message
    assert any(url in message for url in urls)


@pytest.mark.parametrize("kind", KINDS)
def test_422_is_not_retried(service: Any, kind: str) -> None:
    before = service.metric("genaug_rejections_total", 'reason="invalid"')
    with pytest.raises(InvalidRequestError) as caught:
        call(kind, service.url, "generate", "x", height=100000, client={"retry_deadline": 30})
    error = caught.value
    assert error.status == 422 and error.field == "height"
    assert error.error_type == "invalid_request" and "GENAUG_MAX_SIDE" in str(error)
    assert service.metric("genaug_rejections_total", 'reason="invalid"') == before + 1


# -- authentication and identity -------------------------------------------------------------


@pytest.fixture
def keyed(make_service: Any) -> Any:
    return make_service(api_keys=["k1"])


@pytest.mark.parametrize("kind", KINDS)
def test_missing_key_is_authentication_error_naming_the_variable(
    keyed: Any, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GENAUG_API_KEY", raising=False)
    started = time.monotonic()
    with pytest.raises(AuthenticationError) as caught:
        call(kind, keyed.url, "info", client={"retry_deadline": 30})
    assert time.monotonic() - started < 5  # not retried
    assert caught.value.status == 401 and "GENAUG_API_KEY" in str(caught.value)
    with pytest.raises(AuthenticationError):
        call(kind, keyed.url, "info", client={"api_key": "wrong"})
    assert keyed.metric("genaug_rejections_total", 'reason="auth"') == 2


@pytest.mark.parametrize("kind", KINDS)
def test_api_key_from_argument_and_environment(
    keyed: Any, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GENAUG_API_KEY", raising=False)
    assert call(kind, keyed.url, "info", client={"api_key": "k1"})["auth"] is True
    monkeypatch.setenv("GENAUG_API_KEY", "k1")
    assert call(kind, keyed.url, "info")["auth"] is True
    result = call(kind, keyed.url, "generate", "x", seed=2, steps=1)
    assert result.seeds.tolist() == [2]


def test_client_id_and_key_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GENAUG_API_KEY", raising=False)
    options: dict[str, Any] = {"timeout": 1.0, "retry_deadline": 1.0}
    base = BaseClient("http://h:1", api_key="s3cret", client_id="trainer-a", **options)
    headers = base.headers("image/png")
    assert headers["X-Client-Id"] == "trainer-a"
    assert headers["Authorization"] == "Bearer s3cret"
    assert headers["Accept"] == "image/png"
    plain = BaseClient("http://h:1", api_key=None, client_id=None, **options).headers()
    assert "X-Client-Id" not in plain and "Authorization" not in plain


@pytest.mark.parametrize("kind", KINDS)
def test_client_id_reaches_the_service(service: Any, kind: str) -> None:
    call(kind, service.url, "generate", "x", n=1, client={"client_id": f"trainer-{kind}"})
    listed = httpx.get(f"{service.url}/v1/clients").json()["clients"]
    assert any(row["client"] == f"trainer-{kind}" for row in listed)  # the header was sent
    # One the service would refuse (422 on every request) is refused when the client is made,
    # with a name that works.
    with pytest.raises(ValueError, match=r"client_id 'not valid!' is not 1-64 characters .* "
                                         r"such as 'not-valid'"):
        call(kind, service.url, "info", client={"client_id": "not valid!"})
    with pytest.raises(ValueError, match=r"client_id 'trainer-a\\n'"):  # read from a file
        call(kind, service.url, "info", client={"client_id": "trainer-a\n"})


def test_url_defaults_to_genaug_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENAUG_URL", "http://a:1/, http://b:2")
    with Client() as client:
        assert client.urls == ["http://a:1", "http://b:2"]
    monkeypatch.delenv("GENAUG_URL")
    with Client() as client:
        assert client.urls == ["http://127.0.0.1:8000"]


def test_a_200_that_is_not_a_batch_is_decode_error() -> None:
    with pytest.raises(DecodeError, match="not a genaug batch"):
        decode_generate(b"<html>proxy login</html>")


# -- replica choice and backoff (no I/O) -----------------------------------------------------


def test_least_outstanding_healthy_replica_is_chosen() -> None:
    endpoints = Endpoints(["http://a", "http://b/", "http://c"])
    a, b, c = endpoints.endpoints
    assert b.url == "http://b"
    a.outstanding, b.outstanding, c.outstanding = 2, 0, 1
    now = 1000.0
    assert endpoints.pick(now) is b
    endpoints.mark_down(b, now)
    assert endpoints.healthy_count(now) == 2
    assert endpoints.pick(now) is c
    endpoints.mark_down(c, now)
    endpoints.mark_down(c, now)  # a second fault: a longer rest than b's
    assert c.down_until > b.down_until > now
    assert endpoints.pick(now) is a
    endpoints.mark_down(a, now + 0.1)
    assert endpoints.healthy_count(now + 0.2) == 0
    assert endpoints.pick(now + 0.2) is b  # all resting: the one back first
    assert endpoints.pick(b.down_until + 0.01) is b  # back in rotation after its cooldown
    endpoints.mark_up(c)
    assert c.failures == 0 and endpoints.pick(now + 0.2) is c
    with pytest.raises(ValueError):
        Endpoints([])


def test_ties_between_equally_busy_replicas_are_spread() -> None:
    endpoints = Endpoints(["http://a", "http://b"])
    picked = {endpoints.pick(0.0).url for _ in range(200)}
    assert picked == {"http://a", "http://b"}


def test_backoff_grows_with_full_jitter_within_bounds() -> None:
    error = TransportError("refused")
    maxima = []
    for attempt in range(1, 9):
        delays = []
        for _ in range(200):
            retry = RetryState(deadline_s=60)
            retry.attempt = attempt - 1
            delays.append(retry.next_delay(error))
        bound = min(5.0, 0.2 * 2**attempt)
        assert all(0.0 <= d <= bound for d in delays), (attempt, max(delays), bound)
        assert max(delays) > bound / 2 and min(delays) < bound / 2  # jitter spans the range
        maxima.append(max(delays))
    assert maxima[0] <= 0.4 and maxima[-1] > 4.0


def test_retry_after_is_a_floor_and_failover_skips_backoff() -> None:
    limited = RateLimitedError("429", status=429, retry_after=2.0)
    assert all(RetryState(deadline_s=60).next_delay(limited) >= 2.0 for _ in range(50))
    assert RetryState(deadline_s=60).next_delay(limited, failover=True) == 2.0
    assert RetryState(deadline_s=60).next_delay(TransportError("x"), failover=True) == 0.0
    # A 503 from one replica says nothing about the next one.
    down = UnavailableError("503", status=503, retry_after=10.0)
    assert RetryState(deadline_s=60).next_delay(down, failover=True) == 0.0
    assert RetryState(deadline_s=60).next_delay(down) >= 10.0


def test_non_retryable_errors_and_the_deadline_raise() -> None:
    invalid = InvalidRequestError("422", status=422, field="n")
    with pytest.raises(InvalidRequestError) as caught:
        RetryState(deadline_s=60).next_delay(invalid)
    assert caught.value is invalid
    limited = RateLimitedError("429 from x", status=429, retry_after=5.0)
    with pytest.raises(RateLimitedError, match="retry_deadline of 1 s"):
        RetryState(deadline_s=1.0).next_delay(limited)  # Retry-After beyond the deadline
    with pytest.raises(TransportError, match="gave up after 1 attempts"):
        RetryState(deadline_s=0.0).next_delay(TransportError("refused"))


def test_a_sample_says_which_real_image_each_variant_came_from() -> None:
    images = np.zeros((3, 8, 8, 3), np.uint8)
    seeds = np.arange(3, dtype=np.int64)
    plain = encode_batch(images, seeds, labels=[0, 0, 1], metadata={"label_names": ["a", "b"]})
    assert decode_sample(plain, "r").source_hashes is None  # text-to-image only
    hashes = ["h0", None, "h1"]
    mixed = encode_batch(images, seeds, labels=[0, 1, 0],
                         metadata={"label_names": ["a", "b"], "source_hashes": hashes})
    assert decode_sample(mixed, "r").source_hashes == hashes
    short = encode_batch(images, seeds, metadata={"source_hashes": ["h0"]})
    with pytest.raises(DecodeError, match="source_hashes for 1 images with a sample of 3"):
        decode_sample(short, "r")


@pytest.mark.parametrize("kind", KINDS)
def test_labels_given_as_numbers_are_a_clear_error_before_any_request(kind: str) -> None:
    # The digits recipe's labels are the names "0".."9": a number is the natural slip. It is
    # refused before any I/O (the closed port is never dialled), naming the value and the fix.
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(TypeError) as one:
        call(kind, url, "sample", "digits", labels=3, n=4)
    assert str(one.value) == (
        "labels=3: give a label name or a list of names, e.g. labels='3' or labels=['3']; "
        "a recipe's labels are strings, even digits (client.recipe(name)['labels'] lists "
        "them)")
    with pytest.raises(TypeError) as listed:
        call(kind, url, "sample", "digits", labels=["3", 5], n=4)
    assert str(listed.value).startswith(
        "labels=['3', 5]: 5 (int) is not a label name; a recipe's labels are strings, even "
        "digits: pass labels=['3', '5']")
