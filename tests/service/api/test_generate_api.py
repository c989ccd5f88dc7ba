"""The generation API against a real uvicorn server running the tiny diffusers pipeline."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import numpy as np
import pytest

from genaug.wire import SAFETENSORS_MEDIA_TYPE, decode_batch


def post(live: Any, body: Any, **kwargs: Any) -> httpx.Response:
    headers = kwargs.pop("headers", {})
    if isinstance(body, (dict, list)):
        return httpx.post(live.url + "/v1/generate", json=body, headers=headers, timeout=300,
                          **kwargs)
    return httpx.post(live.url + "/v1/generate", content=body,
                      headers={"content-type": "application/json", **headers}, timeout=60,
                      **kwargs)


@contextmanager
def held_by(live: Any, body: dict[str, Any]) -> Iterator[None]:
    """``body`` posted and held in the worker for the block (on a one-image-batch service, so
    what the block posts waits in the queue); then released, and answered 200."""
    live.worker.gate.clear()
    with ThreadPoolExecutor(1) as pool:
        holder = pool.submit(post, live, body)
        live.worker.entered.wait(10)
        try:
            yield
        finally:  # released even when the block fails, or the pool would wait on it forever
            live.worker.gate.set()
        assert holder.result().status_code == 200


def post_together(live: Any, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    """``bodies`` posted at once while the worker is held, so that all of them are queued
    before the first batch closes; the worker released once all are admitted; the answers,
    in order."""
    live.worker.gate.clear()
    admitted = live.admitted()
    with ThreadPoolExecutor(len(bodies)) as pool:
        futures = [pool.submit(post, live, body) for body in bodies]
        try:
            live.wait_until(lambda: live.admitted() == admitted + len(bodies),
                            what=f"{len(bodies)} requests admitted")
        finally:  # released even when the wait fails, or the pool would wait on it forever
            live.worker.gate.set()
        return [f.result() for f in futures]


def test_probes_info_and_metrics(service: Any) -> None:
    assert httpx.get(service.url + "/healthz").json() == {"status": "ok", "detail": None}
    assert httpx.get(service.url + "/readyz").status_code == 200
    info = httpx.get(service.url + "/v1/info").json()
    assert info["ready"] is True
    assert info["model"]["kind"] == "tiny-random"
    assert len(info["model"]["hash"]) == 16 and info["model"]["dtype"] == "float32"
    assert info["device"]["name"] == "cpu" and info["device"]["type"] == "cpu"
    assert info["device"]["torch_threads"] >= 1 and info["device"]["cuda_uuid"] is None
    assert info["limits"]["max_batch_images"] == 8
    assert info["limits"]["default_size"] == 64
    assert set(info) >= {"model", "device", "adapters", "acceleration", "replica", "limits"}
    # `speed`, the acceleration group's old name, answers the same for one release, and the
    # schema marks it deprecated (a recipe's and a request's `speed` is the sampler mode).
    assert info["speed"] == info["acceleration"] and info["acceleration"]["compile"] == "off"
    schema = httpx.get(service.url + "/openapi.json").json()["components"]["schemas"]
    assert schema["InfoResponse"]["properties"]["speed"]["deprecated"] is True
    assert "deprecated" not in schema["InfoResponse"]["properties"]["acceleration"]
    text = httpx.get(service.url + "/metrics").text
    for name in ("genaug_queue_images", "genaug_batch_images", "genaug_images_generated",
                 "genaug_queue_wait_seconds", "genaug_request_latency_seconds",
                 "genaug_rejections", "genaug_dropped_before_pipeline"):
        assert name in text, name


def test_generate_shapes_dtypes_and_seeds(service: Any) -> None:
    r = post(service, {"prompt": "a red circle", "n": 3, "seed": 11})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == SAFETENSORS_MEDIA_TYPE
    batch = decode_batch(r.content)
    assert batch.images.dtype == np.uint8 and batch.images.shape == (3, 64, 64, 3)
    assert batch.seeds.dtype == np.int64 and batch.seeds.tolist() == [11, 12, 13]
    assert batch.metadata["request"]["prompt"] == "a red circle"
    assert batch.metadata["model_hash"] == httpx.get(service.url + "/v1/info").json()[
        "model"]["hash"]
    # Wire overhead is a fixed header: the tensors are raw bytes.
    assert len(r.content) - batch.images.nbytes - batch.seeds.nbytes < 2048


def test_output_resize_and_png(service: Any) -> None:
    r = post(service, {"prompt": "x", "n": 2, "height": 64, "width": 64, "output_height": 24,
                       "output_width": 40, "seed": 1})
    assert r.status_code == 200, r.text
    assert decode_batch(r.content).images.shape == (2, 24, 40, 3)
    png = post(service, {"prompt": "x", "n": 4, "seed": 1}, headers={"Accept": "image/png"})
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    import io

    from PIL import Image

    grid = Image.open(io.BytesIO(png.content))
    assert grid.size == (128, 128)  # 2x2 grid of 64x64


def test_same_seed_same_image_alone_and_in_a_batch_of_8(service: Any) -> None:
    alone = decode_batch(post(service, {"prompt": "a blue square", "seed": 4242}).content)
    calls_before = len(service.worker.calls)
    bodies = [{"prompt": f"mate {i}", "seed": i} for i in range(7)]
    bodies.insert(3, {"prompt": "a blue square", "seed": 4242})
    results = post_together(service, bodies)  # queued together: they share a batch
    batch_sizes = [len(items) for _, items in service.worker.calls[calls_before:]]
    assert max(batch_sizes) > 1, batch_sizes
    together = decode_batch(results[3].content)
    np.testing.assert_array_equal(alone.images[0], together.images[0])
    # and an image does depend on its seed
    assert not np.array_equal(decode_batch(results[0].content).images[0], alone.images[0])


def test_16_concurrent_single_requests_are_batched(service: Any) -> None:
    before_count = service.metric("genaug_batch_images_count", 'source="request"')
    before_sum = service.metric("genaug_batch_images_sum", 'source="request"')
    responses = post_together(service, [{"prompt": f"c{i}", "seed": i} for i in range(16)])
    assert all(r.status_code == 200 for r in responses)
    batches = service.metric("genaug_batch_images_count", 'source="request"') - before_count
    images = service.metric("genaug_batch_images_sum", 'source="request"') - before_sum
    assert images == 16
    assert batches < 16 and images / batches > 1, (batches, images)


def test_grouping_never_mixes_sizes_or_steps(service: Any) -> None:
    worker = service.worker
    start = len(worker.calls)
    shapes = [(64, 64, 4), (32, 32, 4), (64, 64, 2), (32, 64, 4)]
    bodies = [{"prompt": f"{h}x{w}x{s}#{i}", "height": h, "width": w, "steps": s, "n": 2,
               "seed": i} for i, (h, w, s) in enumerate(shapes * 3)]
    responses = post_together(service, bodies)
    for body, r in zip(bodies, responses, strict=True):
        assert r.status_code == 200
        assert decode_batch(r.content).images.shape == (2, body["height"], body["width"], 3)
    for key, items in worker.calls[start:]:
        for item in items:
            h, w, s = (int(v) for v in item.prompt.split("#")[0].split("x"))
            assert (key.height, key.width, key.steps) == (h, w, s), (key, item.prompt)


def test_request_larger_than_a_batch_is_split_and_reassembled(service: Any) -> None:
    r = post(service, {"prompt": "many", "n": 20, "seed": 100})
    batch = decode_batch(r.content)
    assert batch.seeds.tolist() == list(range(100, 120))
    single = decode_batch(post(service, {"prompt": "many", "seed": 113}).content)
    np.testing.assert_array_equal(batch.images[13], single.images[0])


def test_queue_full_answers_429_with_retry_after(make_service: Any) -> None:
    live = make_service(max_batch_images=1, max_queue_images=4, max_wait_ms=0)
    with held_by(live, {"prompt": "hold", "n": 4}):  # one image in the worker, three queued
        r = post(live, {"prompt": "too many", "n": 4})
        assert r.status_code == 429, r.text
        assert int(r.headers["Retry-After"]) >= 1
        error = r.json()["error"]
        assert error["type"] == "queue_full" and "GENAUG_MAX_QUEUE_IMAGES" in error["message"]
    assert live.metric("genaug_rejections_total", 'reason="queue_full"') == 1


def test_expired_deadline_is_504_and_never_reaches_the_pipeline(make_service: Any) -> None:
    live = make_service(max_batch_images=1, max_wait_ms=0)
    with held_by(live, {"prompt": "blocker"}):
        r = post(live, {"prompt": "impatient", "timeout_s": 0.5})
        assert r.status_code == 504, r.text
        assert r.json()["error"]["type"] == "deadline_exceeded"
    post(live, {"prompt": "after"})  # one more batch: the expired one would have run by now
    assert "impatient" not in live.worker.prompts
    assert live.metric("genaug_dropped_before_pipeline_total", 'reason="expired"') == 1


def test_disconnected_client_costs_no_pipeline_work(make_service: Any) -> None:
    live = make_service(max_batch_images=1, max_wait_ms=0)
    with held_by(live, {"prompt": "blocker"}):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(live.url + "/v1/generate", json={"prompt": "goes away"}, timeout=0.5)
        deadline = time.monotonic() + 10
        while live.metric("genaug_dropped_before_pipeline_total", 'reason="disconnected"') < 1:
            assert time.monotonic() < deadline, "disconnect not noticed"
            time.sleep(0.05)
    post(live, {"prompt": "after"})
    assert "goes away" not in live.worker.prompts
    assert live.metric("genaug_queue_images") == 0


def test_round_robin_a_flood_does_not_starve_a_notebook(make_service: Any) -> None:
    live = make_service(max_batch_images=8, max_wait_ms=5, max_queue_images=1000)
    worker = live.worker
    worker.gate.clear()
    done_order: list[str] = []
    lock = threading.Lock()

    def send(body: dict[str, Any], client: str) -> int:
        r = post(live, body, headers={"X-Client-Id": client})
        with lock:
            done_order.append(body["prompt"])
        return r.status_code

    with ThreadPoolExecutor(30) as pool:
        flood = [pool.submit(send, {"prompt": f"flood {i}", "n": 8, "priority": "bulk"},
                             "trainer-a") for i in range(10)]
        # 80 bulk images (10 batches) admitted, one batch of them held in the worker.
        live.wait_until(lambda: live.admitted("trainer-a") == 10 and worker.entered.is_set(),
                        what="the flood admitted")
        notebook = pool.submit(send, {"prompt": "notebook"}, "notebook-b")
        live.wait_until(lambda: live.queued("notebook-b") == 1, what="the notebook queued")
        worker.gate.set()
        assert notebook.result() == 200
        with lock:
            flood_done_first = sum(p.startswith("flood") for p in done_order[:done_order.index(
                "notebook")])
        assert all(f.result() == 200 for f in flood)
    # The worker held one flood batch when the notebook arrived; at most that one goes first.
    assert flood_done_first <= 1, done_order[:5]
    first_batches = [[it.prompt for it in items] for _, items in worker.calls[:2]]
    assert any("notebook" in b for b in first_batches), first_batches


def test_same_priority_clients_share_batches(make_service: Any) -> None:
    live = make_service(max_batch_images=4, max_wait_ms=5, max_queue_images=1000)
    live.worker.gate.clear()
    with ThreadPoolExecutor(4) as pool:
        a = pool.submit(post, live, {"prompt": "A", "n": 16, "priority": "bulk"},
                        headers={"X-Client-Id": "a"})
        # A's first batch is in the (held) worker, its other 12 images wait.
        live.wait_until(lambda: live.worker.entered.is_set() and live.queued("a") == 12,
                        what="A's first batch taken")
        b = pool.submit(post, live, {"prompt": "B", "n": 4, "priority": "bulk"},
                        headers={"X-Client-Id": "b"})
        live.wait_until(lambda: live.queued("b") == 4, what="B queued")
        live.worker.gate.set()
        assert a.result().status_code == 200 and b.result().status_code == 200
    batches = ["".join(it.prompt for it in items) for _, items in live.worker.calls]
    # The first batch was taken before B arrived; every later batch until B is done has B in it.
    b_batches = [i for i, b in enumerate(batches) if "B" in b]
    assert b_batches[0] <= 1 and b_batches[-1] <= 3, batches


BAD_BODIES: list[tuple[str, Any, str]] = [
    ("height 0", {"prompt": "x", "height": 0}, "height"),
    ("height 100000", {"prompt": "x", "height": 100000}, "height"),
    ("n 10**6", {"prompt": "x", "n": 10**6}, "n"),
    ("negative steps", {"prompt": "x", "steps": -3}, "steps"),
    ("not a multiple of 8", {"prompt": "x", "width": 100}, "width"),
    ("string for int", {"prompt": "x", "n": "4"}, "n"),
    ("float for int", {"prompt": "x", "height": 64.5}, "height"),
    ("bool for int", {"prompt": "x", "n": True}, "n"),
    ("list prompt", {"prompt": ["x"]}, "prompt"),
    ("unknown field", {"prompt": "x", "cfg": 3}, "cfg"),
    ("empty prompt", {"prompt": ""}, "prompt"),
    ("blank prompt", {"prompt": "   "}, "prompt"),
    # Spaces to Python but not to JSON Schema's \s (and the reverse): the schema lists them
    ("separator-only prompt", {"prompt": "\x1d\x1f"}, "prompt"),
    ("BOM-only prompt", {"prompt": "\ufeff "}, "prompt"),
    ("missing prompt", {"n": 1}, "prompt"),
    ("bad priority", {"prompt": "x", "priority": "urgent"}, "priority"),
    ("timeout below the minimum", {"prompt": "x", "timeout_s": 0.1}, "timeout_s"),
    ("seed + n past int64", {"prompt": "x", "n": 2, "seed": 2**63 - 1}, "seed"),
    ("integral float too large", {"prompt": "x", "n": 1e6}, "n"),
    ("negative seed", {"prompt": "x", "seed": -1}, "seed"),
    ("huge seed", {"prompt": "x", "seed": 2**64}, "seed"),
    ("zero timeout", {"prompt": "x", "timeout_s": 0}, "timeout_s"),
    ("long prompt", {"prompt": "x" * 5000}, "prompt"),
    ("array body", [1, 2], None),
]


@pytest.mark.parametrize(("case", "body", "field"), BAD_BODIES, ids=[c[0] for c in BAD_BODIES])
def test_bad_input_is_a_clear_422(service: Any, case: str, body: Any, field: str | None) -> None:
    r = post(service, body)
    assert r.status_code == 422, (case, r.status_code, r.text)
    error = r.json()["error"]
    assert error["type"] == "invalid_request"
    if field is not None:
        assert error["field"] == field
        assert field in error["message"]
    assert len(error["message"]) > 20
    if case in {"blank prompt", "separator-only prompt", "BOM-only prompt"}:
        assert "has only space characters" in error["message"]


def test_one_output_side_keeps_the_aspect_ratio_and_integral_floats_are_integers(
    service: Any,
) -> None:
    r = post(service, {"prompt": "x", "n": 1.0, "height": 64, "width": 32.0,
                       "output_height": 32, "guidance": 3})
    assert r.status_code == 200, r.text
    assert decode_batch(r.content).images.shape == (1, 32, 16, 3)


def test_limits_name_the_setting(service: Any) -> None:
    error = post(service, {"prompt": "x", "height": 100000}).json()["error"]
    assert "100000" in error["message"] and "max_side 2048" in error["message"]
    assert "GENAUG_MAX_SIDE" in error["message"]
    error = post(service, {"prompt": "x", "n": 10**6}).json()["error"]
    assert "max_n 64" in error["message"] and "GENAUG_MAX_N" in error["message"]


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b'{"prompt": "x", "n": NaN}', b'{"prompt": "x", "guidance": Infinity}',
     b"\xff\xfe\x00garbage", b"", b'{"prompt": "x"' + b"}" * 3],
    ids=["malformed", "nan", "infinity", "invalid utf-8", "empty", "trailing"],
)
def test_malformed_bodies_are_4xx(service: Any, raw: bytes) -> None:
    r = post(service, raw)
    assert 400 <= r.status_code < 500, r.text
    assert "error" in r.json()


def test_megabyte_prompt_is_refused_before_parsing(service: Any) -> None:
    r = post(service, json.dumps({"prompt": "x" * 1_000_000}).encode())
    assert r.status_code == 413
    error = r.json()["error"]
    assert error["type"] == "body_too_large" and "GENAUG_MAX_BODY_BYTES" in error["message"]


def test_unknown_route_and_method_use_the_error_shape(service: Any) -> None:
    r = httpx.get(service.url + "/v1/nope")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
    r = httpx.get(service.url + "/v1/generate")
    assert r.status_code == 405 and "error" in r.json()


def test_bad_client_id_is_422(service: Any) -> None:
    r = post(service, {"prompt": "x"}, headers={"X-Client-Id": "a b c" * 30})
    assert r.status_code == 422 and r.json()["error"]["field"] == "X-Client-Id"


def test_api_keys_are_enforced(make_service: Any, caplog: pytest.LogCaptureFixture) -> None:
    live = make_service(api_keys=["s3cret-key", "other-key"])
    assert httpx.get(live.url + "/healthz").status_code == 200
    assert httpx.get(live.url + "/readyz").status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-API-Key": "s3cret-kez"}):
        r = post(live, {"prompt": "x"}, headers=headers)
        assert r.status_code == 401, headers
        assert r.json()["error"]["type"] == "unauthorized"
        assert "s3cret" not in r.text and "GENAUG_API_KEY" in r.text
    for path in ("/v1/info", "/metrics", "/docs", "/openapi.json"):
        assert httpx.get(live.url + path).status_code == 401, path
    ok = post(live, {"prompt": "x"}, headers={"Authorization": "Bearer s3cret-key"})
    assert ok.status_code == 200
    ok = post(live, {"prompt": "x"}, headers={"X-API-Key": "other-key"})
    assert ok.status_code == 200
    assert "s3cret-key" not in caplog.text and "other-key" not in caplog.text


def test_docs_page_works_offline(service: Any) -> None:
    html = httpx.get(service.url + "/docs").text
    assert "swagger-ui" in html.lower()
    assert "cdn" not in html.lower() and "https://" not in html
    import re

    for src in re.findall(r'(?:src|href)="([^"]+)"', html):
        assert src.startswith("/"), src
        assert httpx.get(service.url + src).status_code == 200, src
    spec = httpx.get(service.url + "/openapi.json").json()
    assert set(spec["paths"]) >= {"/healthz", "/readyz", "/v1/info", "/v1/generate", "/metrics"}
