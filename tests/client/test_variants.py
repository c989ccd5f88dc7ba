"""``Client.variants`` / ``AsyncClient.variants``: the request they send, decoded as a server
would (multipart parts, the safetensors images part, the params JSON), the answer they return
(``sources``), and the same call against a live service.

Also: both clients expose the same methods with the same signatures, and the one backoff
formula behind every retry.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import random
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

import httpx
import numpy as np
import pytest
from safetensors.numpy import save

from genaug.client import AsyncClient, Client, GenerateResult, backoff_s
from genaug.wire import (
    SAFETENSORS_MEDIA_TYPE,
    WireError,
    decode_batch,
    decode_image_upload,
    encode_batch,
    encode_image_upload,
)

KINDS = ["sync", "async"]


def parts_of(request: httpx.Request) -> dict[str, tuple[str | None, str, bytes]]:
    """name -> (filename, content type, bytes) of a multipart/form-data request."""
    head = f"Content-Type: {request.headers['content-type']}\r\n\r\n".encode()
    message = BytesParser(policy=HTTP).parsebytes(head + request.content)
    assert message.is_multipart()
    out: dict[str, tuple[str | None, str, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        assert isinstance(name, str) and name not in out, name
        payload = part.get_payload(decode=True)
        assert isinstance(payload, bytes)
        out[name] = (part.get_filename(), part.get_content_type(), payload)
    return out


def answer(sources: list[int], h: int = 16, w: int = 24) -> bytes:
    n = len(sources)
    images = np.arange(n * h * w * 3, dtype=np.int64).reshape(n, h, w, 3).astype(np.uint8)
    return encode_batch(images, np.arange(100, 100 + n), sources=np.array(sources),
                        metadata={"model_hash": "ab"})


def run_variants(kind: str, handler: Any, images: Any, prompt: str, **kwargs: Any) -> Any:
    transport = httpx.MockTransport(handler)
    if kind == "sync":
        with Client("http://genaug.test", retry_deadline=0) as client:
            client._http = httpx.Client(transport=transport)
            return client.variants(images, prompt, **kwargs)

    async def main() -> Any:
        async with AsyncClient("http://genaug.test", retry_deadline=0) as client:
            client._http = httpx.AsyncClient(transport=transport)
            return await client.variants(images, prompt, **kwargs)

    return asyncio.run(main())


@pytest.mark.parametrize("kind", KINDS)
def test_variants_sends_one_images_part_and_a_params_part(kind: str) -> None:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, content=answer([0, 0, 0, 1, 1, 1]),
                              headers={"content-type": SAFETENSORS_MEDIA_TYPE})

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(2, 16, 24, 3), dtype=np.uint8)
    result = run_variants(kind, handler, images, "a handwritten three", strength=0.4,
                          n_per_image=3, seed=7, steps=5, adapter="wounds", scheduler="euler")

    (request,) = sent
    assert request.method == "POST" and request.url.path == "/v1/variants"
    assert request.headers["accept"] == SAFETENSORS_MEDIA_TYPE
    assert request.headers["content-type"].startswith("multipart/form-data; boundary=")
    parts = parts_of(request)
    assert set(parts) == {"images", "params"}
    filename, ctype, payload = parts["images"]
    assert filename == "images.safetensors" and ctype == SAFETENSORS_MEDIA_TYPE
    np.testing.assert_array_equal(decode_image_upload(payload), images)
    filename, ctype, payload = parts["params"]
    assert filename is None and ctype == "application/json"
    assert json.loads(payload) == {
        "prompt": "a handwritten three", "strength": 0.4, "n_per_image": 3, "seed": 7,
        "steps": 5, "priority": "interactive", "adapter": "wounds", "scheduler": "euler",
    }  # unset options are left to the service's defaults

    assert isinstance(result, GenerateResult) and len(result) == 6
    assert result.sources is not None and result.sources.tolist() == [0, 0, 0, 1, 1, 1]
    assert result.seeds.tolist() == list(range(100, 106))
    assert result.images.shape == (6, 16, 24, 3)


@pytest.mark.parametrize("kind", KINDS)
def test_one_image_is_a_batch_of_one(kind: str) -> None:
    uploads: list[np.ndarray] = []

    def handler(request: httpx.Request) -> httpx.Response:
        uploads.append(decode_image_upload(parts_of(request)["images"][2]))
        return httpx.Response(200, content=answer([0]))

    image = np.full((16, 24, 3), 9, np.uint8)
    result = run_variants(kind, handler, image, "x")
    assert uploads[0].shape == (1, 16, 24, 3) and int(uploads[0].max()) == 9
    assert result.sources.tolist() == [0]


@pytest.mark.parametrize(
    "images",
    [np.zeros((1, 8, 8, 3), np.float32), np.zeros((1, 8, 8, 1), np.uint8),
     np.zeros((8, 8), np.uint8), np.zeros((0, 8, 8, 3), np.uint8)],
    ids=["float", "one channel", "2-d", "no image"],
)
def test_bad_images_are_refused_before_anything_is_sent(images: np.ndarray) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError("nothing may be sent")

    with pytest.raises(ValueError, match=r"uint8 images \[N, H, W, 3\]"):
        run_variants("sync", handler, images, "x")


@pytest.mark.parametrize(
    "images",
    [np.random.default_rng(1).random((2, 64, 64), dtype=np.float32),  # gray floats, no C axis
     np.random.default_rng(2).random((64, 64, 3)),  # one float64 image
     np.zeros((64, 64, 4), np.uint8)],  # one RGBA image
    ids=["two gray floats", "one float image", "one RGBA image"],
)
def test_the_refusal_quotes_the_shape_the_user_passed_and_its_fix_works(
    images: np.ndarray,
) -> None:
    # a [H, W, 3] input is wrapped into a batch of one before the check; the message must
    # still quote what the user passed, not the (1, ...) batch they never made
    def refuse(request: httpx.Request) -> httpx.Response:
        raise AssertionError("nothing may be sent")

    with pytest.raises(ValueError) as caught:
        run_variants("sync", refuse, images, "x")
    message = str(caught.value)
    assert "\n" not in message
    assert f"got {images.dtype} {tuple(images.shape)}." in message, message
    assert f"(1, {', '.join(map(str, images.shape))})" not in message, message

    # the conversions the message names, applied in its order, give what variants() takes
    x = images
    for fix in message.split("Convert with ", 1)[1].split(", then "):
        if fix.startswith("np.clip(x * 255"):
            x = np.clip(x * 255, 0, 255).astype(np.uint8)
        elif fix.startswith("np.repeat(x[..., None]"):
            x = np.repeat(x[..., None], 3, axis=-1)
        elif fix.startswith("x[..., :3]"):
            x = x[..., :3]
        else:
            raise AssertionError(f"unknown fix {fix!r}")
    uploads: list[np.ndarray] = []

    def accept(request: httpx.Request) -> httpx.Response:
        uploads.append(decode_image_upload(parts_of(request)["images"][2]))
        return httpx.Response(200, content=answer([0] * len(uploads[0]), 64, 64))

    run_variants("sync", accept, x, "x")
    n = images.shape[0] if images.shape[-1] not in (3, 4) else 1
    assert uploads[0].shape == (n, 64, 64, 3)


def test_a_retried_upload_sends_the_same_parts() -> None:
    bodies: list[dict[str, tuple[str | None, str, bytes]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(parts_of(request))
        if len(bodies) == 1:
            return httpx.Response(429, json={"error": {"message": "full"}},
                                  headers={"retry-after": "0"})
        return httpx.Response(200, content=answer([0]))

    with Client("http://genaug.test", retry_deadline=5) as client:
        client._http = httpx.Client(transport=httpx.MockTransport(handler))
        client.variants(np.zeros((8, 8, 3), np.uint8), "x")
    assert len(bodies) == 2 and bodies[0] == bodies[1]


def test_text_to_image_results_have_no_sources() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["adapter_scale"] == 0.5
        return httpx.Response(200, content=encode_batch(np.zeros((1, 8, 8, 3), np.uint8),
                                                        np.zeros(1)))

    with Client("http://genaug.test") as client:
        client._http = httpx.Client(transport=httpx.MockTransport(handler))
        assert client.generate("x", adapter="a", adapter_scale=0.5).sources is None


def test_upload_codec_refuses_what_is_not_an_images_part() -> None:
    with pytest.raises(WireError, match="not a safetensors"):
        decode_image_upload(b"\x89PNG....")
    with pytest.raises(WireError, match="no 'images' tensor"):
        decode_image_upload(save({"pixels": np.zeros((1, 8, 8, 3), np.uint8)}))
    with pytest.raises(WireError, match=r"expected uint8 \[N, H, W, 3\]"):
        decode_image_upload(save({"images": np.zeros((1, 8, 8, 1), np.uint8)}))
    with pytest.raises(WireError, match="no image"):
        decode_image_upload(encode_image_upload(np.zeros((0, 8, 8, 3), np.uint8)))
    # a full genaug batch is accepted as an upload too
    batch = encode_batch(np.ones((2, 8, 8, 3), np.uint8), np.zeros(2))
    assert decode_image_upload(batch).shape == (2, 8, 8, 3)
    assert decode_batch(batch).sources is None


# -- live ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_variants_against_a_live_service(service: Any, kind: str) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(2, 64, 64, 3), dtype=np.uint8)
    if kind == "sync":
        with Client(service.url) as client:
            a = client.variants(images, "a wound", strength=0.5, n_per_image=2, seed=3, steps=4)
            b = client.variants(images[1], "a wound", strength=0.5, n_per_image=2, seed=5,
                                steps=4)
    else:
        async def main() -> tuple[GenerateResult, GenerateResult]:
            async with AsyncClient(service.url) as client:
                first = await client.variants(images, "a wound", strength=0.5, n_per_image=2,
                                              seed=3, steps=4)
                second = await client.variants(images[1], "a wound", strength=0.5,
                                               n_per_image=2, seed=5, steps=4)
                return first, second

        a, b = asyncio.run(main())
    assert a.images.shape == (4, 64, 64, 3) and a.images.dtype == np.uint8
    assert a.sources is not None and a.sources.tolist() == [0, 0, 1, 1]
    assert a.seeds.tolist() == [3, 4, 5, 6]
    # source 1 alone with its seeds gives the same variants as inside the pair
    np.testing.assert_array_equal(b.images, a.images[2:])


# -- the two clients, one surface -------------------------------------------------------------


def _public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(cls).items()
        if not name.startswith("_") and callable(member)
    }


#: What the async client returns in place of the sync one's (the same, awaited).
ASYNC_TWINS = {"'AsyncFillJob'": "'FillJob'"}


def _as_sync(signature: inspect.Signature) -> str:
    text = str(signature)
    for twin, sync in ASYNC_TWINS.items():
        text = text.replace(twin, sync)
    return text


def test_sync_and_async_clients_expose_the_same_methods_and_signatures() -> None:
    sync, aio = _public_methods(Client), _public_methods(AsyncClient)
    # close() / aclose() are the one intended difference, like httpx's
    assert set(sync) - {"close"} == set(aio) - {"aclose"}
    for name in sorted(set(sync) - {"close"}):
        assert str(sync[name]) == _as_sync(aio[name]), f"{name}: {sync[name]} != {aio[name]}"
        assert inspect.iscoroutinefunction(getattr(AsyncClient, name)), name
        assert not inspect.iscoroutinefunction(getattr(Client, name)), name
        assert (getattr(Client, name).__doc__ or "").split("\n")[0] == (
            getattr(AsyncClient, name).__doc__ or ""
        ).split("\n")[0], name
    assert inspect.signature(Client.__init__) == inspect.signature(AsyncClient.__init__)
    assert {"variants", "generate", "sample", "info"} <= set(sync)


def test_the_parity_check_would_notice_a_drift() -> None:
    class Drifted(AsyncClient):
        async def variants(self, images: Any, prompt: str, *, strength: float = 0.9,  # type: ignore[override]
                           **kw: Any) -> Any:
            raise NotImplementedError

    assert _public_methods(Client)["variants"] != _public_methods(Drifted)["variants"]


# -- one backoff formula ------------------------------------------------------------------------


def test_backoff_formula_doubles_caps_and_jitters_down_only() -> None:
    assert [backoff_s(k, initial_s=0.5, max_s=30) for k in (1, 2, 3, 7, 8, 100)] == [
        0.5, 1.0, 2.0, 30.0, 30.0, 30.0]
    assert backoff_s(0, initial_s=0.5, max_s=30) == 0.5
    rng = random.Random(0)
    jittered = [backoff_s(3, initial_s=1, max_s=30, jitter=0.2, rng=rng) for _ in range(500)]
    assert 3.2 <= min(jittered) < 3.3 and 3.95 < max(jittered) <= 4.0
    full = [backoff_s(3, initial_s=1, max_s=30, jitter=1.0, rng=rng) for _ in range(500)]
    assert min(full) < 0.2 and max(full) > 3.8


def test_a_fill_job_and_its_async_twin_have_the_same_methods() -> None:
    from genaug.client import AsyncFillJob, FillJob

    sync, aio = _public_methods(FillJob), _public_methods(AsyncFillJob)
    assert set(sync) == set(aio) == {"status", "wait", "cancel"}
    for name in sync:
        assert str(sync[name]) == str(aio[name]), name
        assert inspect.iscoroutinefunction(getattr(AsyncFillJob, name)), name
        assert not inspect.iscoroutinefunction(getattr(FillJob, name)), name
