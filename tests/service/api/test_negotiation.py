"""Content negotiation on the routes that answer bytes, against a real uvicorn service: what
``Accept`` asks for among the types a route offers, else 406 in the one error shape, before
anything is read, queued or generated; the parser itself on the RFC 9110 grammar."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genaug.service.api.negotiation import BATCH, IMAGE, OCTET_STREAM, parse_accept, preferred
from genaug.service.pipeline.load import LoadedModel
from genaug.service.testing import LiveService, start_service
from genaug.wire import PNG_MEDIA_TYPE, SAFETENSORS_MEDIA_TYPE, decode_batch, encode_image_upload

BODY = {"prompt": "a circle", "n": 1, "height": 32, "width": 32, "steps": 2, "seed": 7}
# What the issue tried on /v1/generate: each got 200 and a safetensors batch.
REFUSED = ("image/jpeg", "text/banana", "application/json", "image/png;q=0, application/json")


@pytest.fixture(scope="module")
def live(tiny_model: LoadedModel, tmp_path_factory: pytest.TempPathFactory,
         shapes_recipe: str) -> Iterator[LiveService]:
    """The shapes recipe, no pre-generation: the pipeline runs only for what a test asks."""
    root = tmp_path_factory.mktemp("negotiation")
    (root / "recipes.yaml").write_text(shapes_recipe)
    with start_service(tiny_model, recipes=root / "recipes.yaml", pool_path=root / "pool.db",
                       max_batch_images=8, max_wait_ms=5, pregenerate=False) as service:
        yield service


def variants_files() -> list[Any]:
    sources = np.random.default_rng(3).integers(0, 256, (1, 32, 32, 3), dtype=np.uint8)
    params = {"prompt": "a variant", "steps": 2, "seed": 4, "n_per_image": 1}
    return [("images", ("s.safetensors", encode_image_upload(sources), SAFETENSORS_MEDIA_TYPE)),
            ("params", (None, json.dumps(params).encode(), "application/json"))]


def call(live: LiveService, route: str, accept: str | None) -> httpx.Response:
    """One request to ``route`` with ``Accept: accept`` (None: no Accept header at all)."""
    method, path = route.split(" ")
    kwargs: dict[str, Any] = {}
    if path == "/v1/generate":
        kwargs["json"] = BODY
    elif path == "/v1/variants":
        kwargs["files"] = variants_files()
    elif path.endswith("/sample"):
        kwargs["json"] = {"n": 1, "wait_s": 30}  # an empty pool: waiting generates
    with httpx.Client(base_url=live.url, timeout=60) as client:
        request = client.build_request(method, path, **kwargs)
        del request.headers["accept"]  # httpx's own */*
        if accept is not None:
            request.headers["accept"] = accept
        return client.send(request)


def assert_refused(answer: httpx.Response, offered: tuple[str, ...], accept: str) -> None:
    assert answer.status_code == 406, (accept, answer.status_code, answer.text[:200])
    error = answer.json()["error"]
    assert set(answer.json()) == {"error"} and error["type"] == "not_acceptable"
    assert error["field"] == "Accept" and accept[:40] in error["message"]
    for media in offered:  # the types it could have asked for
        assert media in error["message"], (media, error["message"])
    assert answer.headers["vary"] == "Accept"


def test_generate_refuses_what_it_cannot_answer_before_queueing_anything(
        live: LiveService) -> None:
    admitted, made = live.admitted(), len(live.worker.prompts)
    for accept in REFUSED:
        assert_refused(call(live, "POST /v1/generate", accept), BATCH.types, accept)
    assert live.admitted() == admitted and len(live.worker.prompts) == made  # no GPU time
    # what it answers: the batch when nothing (or anything) is asked, PNG when that is
    for accept, media in ((None, SAFETENSORS_MEDIA_TYPE), ("*/*", SAFETENSORS_MEDIA_TYPE),
                          ("image/*", PNG_MEDIA_TYPE),
                          ("image/jpeg, image/png;q=0.5", PNG_MEDIA_TYPE),
                          ("application/json, */*;q=0.1", SAFETENSORS_MEDIA_TYPE)):
        answer = call(live, "POST /v1/generate", accept)
        assert answer.status_code == 200, (accept, answer.text)
        assert answer.headers["content-type"] == media, accept
    assert decode_batch(call(live, "POST /v1/generate", None).content).seeds.tolist() == [7]


def test_every_route_that_answers_bytes_negotiates_the_same_way(live: LiveService) -> None:
    routes = {"POST /v1/variants": BATCH, "POST /v1/recipes/shapes/sample": BATCH,
              "GET /v1/recent.png": IMAGE}
    admitted, made = live.admitted(), len(live.worker.prompts)
    for route, offers in routes.items():
        assert_refused(call(live, route, "application/json"), offers.types, "application/json")
        assert_refused(call(live, route, "image/png;q=0, text/*"), offers.types,
                       "image/png;q=0, text/*")
    assert live.admitted() == admitted and len(live.worker.prompts) == made
    # a pool image: make one, then ask for it as JSON
    sample = call(live, "POST /v1/recipes/shapes/sample", "image/png")
    assert sample.status_code == 200 and sample.headers["content-type"] == PNG_MEDIA_TYPE
    assert sample.headers["vary"] == "Accept"
    label = sample.headers["x-genaug-labels"]
    listed = httpx.get(f"{live.url}/v1/recipes/shapes/images", params={"label": label},
                       timeout=30).json()
    one = "GET " + listed["images"][0]["png"]
    assert_refused(call(live, one, "application/json"), IMAGE.types, "application/json")
    assert call(live, one, None).headers["content-type"] == PNG_MEDIA_TYPE
    assert call(live, "GET /v1/recent.png", OCTET_STREAM).headers["content-type"] == OCTET_STREAM
    variants = call(live, "POST /v1/variants", "image/png")
    assert variants.status_code == 200 and variants.content.startswith(b"\x89PNG")


def test_the_schema_lists_each_routes_406_and_the_types_it_answers(live: LiveService) -> None:
    schema = httpx.get(live.url + "/openapi.json", timeout=30).json()
    negotiating = {
        ("/v1/generate", "post"): BATCH, ("/v1/variants", "post"): BATCH,
        ("/v1/recipes/shapes/sample", "post"): BATCH, ("/v1/recent.png", "get"): IMAGE,
        ("/v1/recipes/shapes/images/{label}/{seed}.png", "get"): IMAGE,
    }
    for (path, method), offers in negotiating.items():
        responses = schema["paths"][path][method]["responses"]
        assert list(responses["200"]["content"]) == list(offers.types), path
        refused = responses["406"]
        assert refused["content"]["application/json"]["schema"]["$ref"] == (
            "#/components/schemas/ErrorBody"), path
        assert all(media in refused["description"] for media in offers.types), path
    # and no other route says it answers bytes (each that does negotiates)
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            content = operation["responses"].get("200", {}).get("content", {})
            if any(m.get("schema", {}).get("format") == "binary" for m in content.values()):
                assert (path, method) in negotiating, (path, method)


# -- the parser ------------------------------------------------------------------------------

# Accept -> what a batch route answers (None: 406); RFC 9110 section 12.5.1.
CHOICES: dict[str, str | None] = {
    "*/*": SAFETENSORS_MEDIA_TYPE,
    "": SAFETENSORS_MEDIA_TYPE,  # an empty field says nothing: as if none were sent
    "image/*": PNG_MEDIA_TYPE,
    "IMAGE/PNG": PNG_MEDIA_TYPE,  # types are case-insensitive
    "image/png;Q=0.5": PNG_MEDIA_TYPE,
    "image/png ; q = 0.5 , text/plain": PNG_MEDIA_TYPE,
    "application/*": SAFETENSORS_MEDIA_TYPE,  # the service's order at a tie
    "image/png, */*": PNG_MEDIA_TYPE,  # the more specific range, at equal q
    f"image/png, {SAFETENSORS_MEDIA_TYPE}": SAFETENSORS_MEDIA_TYPE,
    f"image/png;q=0.2, {SAFETENSORS_MEDIA_TYPE};q=0.9": SAFETENSORS_MEDIA_TYPE,
    f"{OCTET_STREAM};q=0, */*": SAFETENSORS_MEDIA_TYPE,
    "*/*;q=0.5, image/*;q=0": SAFETENSORS_MEDIA_TYPE,  # image/* rules png out
    "image/png, */*;q=0": PNG_MEDIA_TYPE,
    'image/png;q=0.5;ext="a,b"': PNG_MEDIA_TYPE,  # after q: an extension, commas quoted
    "image/avif,image/webp,image/apng,image/svg+xml,image/*,*/*;q=0.8": PNG_MEDIA_TYPE,
    "*/*;q=0": None,
    "image/png;q=0": None,
    "image/png;q=1.5": None,  # not a qvalue: accepts nothing
    "image/png;q=0.0001": None,
    "image/png;q=nan": None,
    'image/png;level="1,2"': None,  # a range with parameters: not the parameterless type
    "*/png": None,
    "banana": None,
    ",,": None,
    '"': None,
}


def test_the_parser_follows_rfc_9110() -> None:
    for accept, expected in CHOICES.items():
        assert preferred(accept, BATCH.types) == expected, accept
    assert preferred(None, IMAGE.types) == PNG_MEDIA_TYPE
    assert [(r.type, r.subtype, r.q) for r in parse_accept("text/*;q=0.250, */*")] == [
        ("text", "*", 0.25), ("*", "*", 1.0)]


HEADER_CHARS = st.sampled_from(list('*/;=,"\\ \tq01.5abimgpnejso+-') + ["image/png", "*/*"])


@settings(max_examples=300, deadline=None)
@given(st.lists(HEADER_CHARS, max_size=40).map("".join) | st.text(max_size=60))
def test_no_header_breaks_the_parser(header: str) -> None:
    assert preferred(header, BATCH.types) in (*BATCH.types, None)


@settings(max_examples=60, deadline=None)
@given(st.lists(HEADER_CHARS, min_size=1, max_size=40).map("".join))
def test_odd_accept_values_are_answered_never_a_500(live: LiveService, header: str) -> None:
    header = header.strip(" \t")  # (what a header's value may not begin or end with)
    answer = httpx.get(live.url + "/v1/recent.png", headers={"Accept": header}, timeout=30)
    assert answer.status_code in (200, 204, 406), (header, answer.status_code, answer.text)


def test_a_long_hostile_header_is_answered_at_once(live: LiveService) -> None:
    for header in ('"\\' * 3000, "image/png;" + " " * 6000 + "x", "a/b;c=d;" * 700 + "="):
        answer = httpx.get(live.url + "/v1/recent.png", headers={"Accept": header}, timeout=5)
        assert answer.status_code == 406, header[:40]
