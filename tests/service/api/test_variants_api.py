"""``POST /v1/variants`` over real HTTP: img2img variants of uploaded sources (PNG parts or a
safetensors batch), in source-major order with per-image seeds, under the same rules as
generation: batch invariance, reproducibility, bounds, per-route upload limits, 422s naming
the part, no pipeline work for a client that left, and the README's curl line."""

from __future__ import annotations

import io
import json
import re
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from genaug.service.pipeline.load import LoadedModel
from genaug.service.testing import LiveService, start_service
from genaug.wire import PNG_MEDIA_TYPE, decode_batch, encode_image_upload

README = Path(__file__).resolve().parents[3] / "README.md"


@pytest.fixture(scope="module")
def service(tiny_model: LoadedModel) -> Iterator[LiveService]:
    """Variants with tight limits: 64-pixel sides, 4 sources, 8 images per request."""
    with start_service(tiny_model, max_side=64, max_variant_sources=4, max_n=8,
                       max_batch_images=8) as live:
        yield live


def png(image: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


def sources(n: int, size: int = 64, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def post(live: LiveService, *, images: np.ndarray | None = None, pngs: list[bytes] | None = None,
         params: dict[str, Any] | None = None, raw_params: bytes | None = None,
         headers: dict[str, str] | None = None, timeout: float = 120) -> httpx.Response:
    files: list[tuple[str, tuple[str | None, bytes, str]]] = []
    for i, data in enumerate(pngs or []):
        files.append(("image", (f"source{i}.png", data, PNG_MEDIA_TYPE)))
    if images is not None:
        files.append(("images", ("images.safetensors", encode_image_upload(images),
                                 "application/octet-stream")))
    body = raw_params if raw_params is not None else json.dumps(
        {"prompt": "a variant", "strength": 0.6, "seed": 10, **(params or {})}).encode()
    files.append(("params", (None, body, "application/json")))
    return httpx.post(live.url + "/v1/variants", files=files, headers=headers or {},
                      timeout=timeout)


def error_of(r: httpx.Response, status: int = 422) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error: dict[str, Any] = r.json()["error"]
    return error


def test_png_parts_and_a_safetensors_batch_give_the_same_variants(service: LiveService) -> None:
    src = sources(2)
    by_png = post(service, pngs=[png(s) for s in src], params={"n_per_image": 3})
    assert by_png.status_code == 200, by_png.text
    batch = decode_batch(by_png.content)
    assert batch.images.shape == (6, 64, 64, 3)
    assert batch.sources is not None and batch.sources.tolist() == [0, 0, 0, 1, 1, 1]
    assert batch.seeds.tolist() == list(range(10, 16))  # seed + j * n_per_image + k
    assert len(batch.metadata["source_hashes"]) == 2
    by_batch = decode_batch(post(service, images=src, params={"n_per_image": 3}).content)
    np.testing.assert_array_equal(by_batch.images, batch.images)
    # variants differ from each other and depend on their source
    assert not np.array_equal(batch.images[0], batch.images[1])
    assert not np.array_equal(batch.images[0], batch.images[3])


def test_a_source_varied_alone_equals_the_same_source_in_a_batch(service: LiveService) -> None:
    src = sources(3, seed=1)
    together = decode_batch(post(service, images=src, params={"n_per_image": 2}).content)
    alone = decode_batch(post(service, images=src[1:2], params={"n_per_image": 2,
                                                                "seed": 12}).content)
    np.testing.assert_array_equal(alone.images, together.images[2:4])
    again = decode_batch(post(service, images=src, params={"n_per_image": 2}).content)
    np.testing.assert_array_equal(again.images, together.images)  # same seed, same images


def test_output_size_and_png_grid(service: LiveService) -> None:
    r = post(service, images=sources(2), params={"output_height": 32, "output_width": 32},
             headers={"Accept": PNG_MEDIA_TYPE})
    assert r.status_code == 200 and r.headers["content-type"] == PNG_MEDIA_TYPE
    assert Image.open(io.BytesIO(r.content)).size == (64, 32)  # a 2x1 grid of 32x32


@pytest.mark.parametrize(
    ("params", "field"),
    [({"strength": 0}, "strength"), ({"strength": 1.5}, "strength"),
     ({"n_per_image": 0}, "n_per_image"), ({"n_per_image": 10**6}, "n_per_image"),
     ({"prompt": " "}, "prompt"), ({"cfg": 3}, "cfg"), ({"steps": 10**6}, "steps")],
    ids=["strength 0", "strength 1.5", "n_per_image 0", "n_per_image huge", "blank prompt",
         "unknown field", "steps"],
)
def test_bad_params_are_422_naming_the_field(
    service: LiveService, params: dict[str, Any], field: str
) -> None:
    error = error_of(post(service, images=sources(1), params=params))
    assert error["field"] == field and error["message"].startswith("params part: ")


def test_bad_uploads_are_422_naming_the_part(service: LiveService) -> None:
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"pngs": [b"GIF89a not a png"]}, "image", "not a PNG"),
        ({"pngs": [b"\x89PNG\r\n\x1a\n truncated"]}, "image", "could not be decoded"),
        ({"pngs": [png(sources(1)[0]), png(sources(1, size=32)[0])]}, "image", "share one size"),
        ({"images": sources(1, size=60)}, "image", "multiple of 8"),
        ({"images": sources(1, size=72)}, "image", "max_side"),
        ({"images": sources(5)}, "images", "max_variant_sources"),
        ({"pngs": [png(sources(1)[0])], "images": sources(1)}, "images", "not both"),
        ({}, "image", "no source image"),
        ({"images": sources(1), "raw_params": b"{not json"}, "params", "not valid JSON"),
    ]
    for kwargs, field, text in cases:
        error = error_of(post(service, **kwargs))
        assert error["field"] == field and text in error["message"], (field, error)
    r = httpx.post(service.url + "/v1/variants", json={"prompt": "x"}, timeout=30)
    assert error_of(r)["field"] == "body" and "multipart/form-data" in r.json()["error"][
        "message"]


def test_uploads_have_their_own_size_limit(make_service: Any) -> None:
    live = make_service(max_body_bytes=4096, max_upload_bytes=200_000, max_side=128)
    big_json = {"prompt": "x" * 5000}
    r = httpx.post(live.url + "/v1/generate", json=big_json, timeout=30)
    assert error_of(r, 413)["type"] == "body_too_large" and "GENAUG_MAX_BODY_BYTES" in r.text
    # a 64x64 upload (12 KB) is over the JSON limit but within the upload limit
    assert post(live, images=sources(1)).status_code == 200
    r = post(live, images=sources(8, size=128))  # 393 KB
    error = error_of(r, 413)
    assert "max_upload_bytes 200000" in error["message"]
    assert "GENAUG_MAX_UPLOAD_BYTES" in error["message"]


def test_a_client_that_left_costs_no_pipeline_work(make_service: Any) -> None:
    live = make_service(max_batch_images=1, max_wait_ms=0)
    live.worker.gate.clear()
    with ThreadPoolExecutor(1) as pool:
        blocker = pool.submit(httpx.post, live.url + "/v1/generate", json={"prompt": "blocker"},
                              timeout=120)
        assert live.worker.entered.wait(30)  # the worker holds the blocker's batch
        with pytest.raises(httpx.ReadTimeout):
            post(live, images=sources(1), params={"prompt": "goes away"}, timeout=1.0)
        live.wait_until(lambda: live.metric("genaug_dropped_before_pipeline_total",
                                            'reason="disconnected"') >= 1,
                        what="the disconnect noticed")
        live.worker.gate.set()
        assert blocker.result().status_code == 200
    assert post(live, images=sources(1), params={"prompt": "stays"}).status_code == 200
    assert "goes away" not in live.worker.prompts and "stays" in live.worker.prompts


def test_the_readme_curl_line_works(service: LiveService, tmp_path: Path) -> None:
    line = next(line for line in README.read_text().splitlines()
                if line.startswith("curl ") and "/v1/variants" in line)
    (tmp_path / "three.png").write_bytes(png(sources(1)[0]))
    command = re.sub(r"http://127\.0\.0\.1:8000", service.url, line)
    out = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    written = [p for p in tmp_path.iterdir() if p.suffix == ".png" and p.name != "three.png"]
    assert written and Image.open(written[0]).size[0] >= 64


def test_a_picture_sent_as_the_images_part_is_named_with_the_fix(service: Any) -> None:
    from PIL import Image

    buffers = {}
    for fmt in ("PNG", "JPEG"):
        out = io.BytesIO()
        Image.new("RGB", (16, 16), "white").save(out, format=fmt)
        buffers[fmt] = out.getvalue()
    for fmt, data in buffers.items():
        r = httpx.post(f"{service.url}/v1/variants", timeout=60,
                       files={"images": ("three." + fmt.lower(), data),
                              "params": (None, '{"prompt": "a three", "strength": 0.5}')})
        error = r.json()["error"]
        assert r.status_code == 422 and error["field"] == "images", r.text
        assert f"is a {fmt} file" in error["message"], error
        assert "the 'images' part takes one genaug safetensors batch" in error["message"]
        assert "'image' parts" in error["message"] and "header" not in error["message"]
