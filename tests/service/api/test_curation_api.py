"""The curation routes on a real service (uvicorn on 127.0.0.1, real httpx): verdicts, the
image listing, one image's PNG, and the per-label counts of ``GET /v1/recipes/{name}``.

The module's pool is seeded through the service's own store (images with judge scores, some
below the judge's bar) as the planner stores a judged batch: the recipe plan's first seeds
(63-bit), each image's first pixel its plan index; nothing is generated there
(``pregenerate=False``). The journey at the end runs docs/curation.md's flow on a service that
fills its pool itself.
"""

from __future__ import annotations

import io
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from genaug.service.intake.fields import SEED_MAX, SEED_TEXT_PATTERN
from genaug.service.recipes.load import parse_recipes
from genaug.service.testing import LiveService, start_service
from genaug.wire import decode_batch

SCORES = [0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.3, 0.2, 0.1, 0.05]


@pytest.fixture(scope="module")
def seeds(shapes_recipe: str) -> list[int]:
    """The circle plan's first 12 seeds, as the planner draws them: 10 stored, 2 never."""
    recipe = parse_recipes(shapes_recipe, path=Path("recipes.yaml"))["shapes"]
    return [item.seed for item in recipe.plan_batch("circle", 0, 12)]


@pytest.fixture(scope="module")
def live(tiny_model: Any, tmp_path_factory: pytest.TempPathFactory,
         shapes_recipe: str, seeds: list[int]) -> Iterator[LiveService]:
    root: Path = tmp_path_factory.mktemp("curation")
    (root / "recipes.yaml").write_text(shapes_recipe)
    with start_service(tiny_model, recipes=root / "recipes.yaml", pool_path=root / "pool.db",
                       pregenerate=False) as live:
        pools = live.state.pools
        assert pools is not None
        images = np.zeros((10, 32, 32, 3), np.uint8)
        images[..., 0] = np.arange(10)[:, None, None] * 20
        pools.store.add(pools.pool_ids["shapes"], "circle", images, seeds[:10],
                        model_hash=pools.planner.model_hash, next_index=10,
                        scores=SCORES, keep=[s >= 0.5 for s in SCORES])
        yield live


def _post(live: LiveService, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(live.url + "/v1/recipes/shapes/verdicts", json=body)


def _sampled(live: LiveService) -> set[int]:
    seen: set[int] = set()
    for _ in range(3):
        r = httpx.post(live.url + "/v1/recipes/shapes/sample",
                       json={"labels": ["circle"], "n": 64})
        assert r.status_code == 200, r.text
        seen |= set(decode_batch(r.content).seeds.tolist())
    return seen


def _counts(live: LiveService) -> dict[str, int]:
    detail = httpx.get(live.url + "/v1/recipes/shapes").json()
    return {k: detail["per_label"]["circle"][k]
            for k in ("fill", "accepted", "rejected", "rejected_by_person", "judged_total",
                      "accepted_total")}


def test_judge_rejected_are_counted_and_never_sampled(live: LiveService, seeds: list[int]
                                                     ) -> None:
    assert _counts(live) == {"fill": 6, "accepted": 6, "rejected": 4, "rejected_by_person": 0,
                             "judged_total": 10, "accepted_total": 6}
    assert _sampled(live) == set(seeds[:6])


def test_reject_and_restore(live: LiveService, seeds: list[int]) -> None:
    s = seeds
    r = _post(live, {"label": "circle", "seeds": [s[1], s[3]], "keep": False})
    assert r.status_code == 200, r.text
    assert r.json() == {"recipe": "shapes", "label": "circle", "keep": False,
                        "changed": [s[1], s[3]], "unchanged": [], "accepted": 4, "rejected": 4,
                        "rejected_by_person": 2}
    assert _sampled(live) == {s[0], s[2], s[4], s[5]}
    assert _counts(live)["rejected_by_person"] == 2
    r = _post(live, {"label": "circle", "seeds": [s[1], s[8], s[3]], "keep": True})
    assert r.status_code == 200, r.text
    assert r.json()["changed"] == [s[1], s[8], s[3]] and r.json()["accepted"] == 7
    assert _sampled(live) == {s[0], s[1], s[2], s[3], s[4], s[5], s[8]}
    r = _post(live, {"label": "circle", "seeds": [s[8]], "keep": False})  # undo the restore
    assert r.json()["changed"] == [s[8]] and r.json()["accepted"] == 6
    # JSON's integer: an integral number is one (this one names no image: 404, not 422)
    r = _post(live, {"label": "circle", "seeds": [float(2**60)], "keep": True})
    assert r.status_code == 404 and str(2**60) in r.json()["error"]["message"]


def test_seeds_travel_as_decimal_strings(live: LiveService, seeds: list[int]) -> None:
    """What the pool page sends: the listing's seed_str, exact where a JSON number is not."""
    listed = httpx.get(live.url + "/v1/recipes/shapes/images",
                       params={"label": "circle", "limit": 500}).json()["images"]
    assert {i["seed_str"]: i["seed"] for i in listed} == {str(x): x for x in seeds[:6]}
    big = [x for x in seeds[:6] if x > 2**53]  # a JavaScript number would round these
    assert len(big) >= 4 and all(float(x) != x for x in big)
    before = _counts(live)["rejected_by_person"]
    r = _post(live, {"label": "circle", "seeds": [str(big[0]), big[1]], "keep": False})
    assert r.status_code == 200, r.text
    assert r.json()["changed"] == big[:2] and r.json()["rejected_by_person"] == before + 2
    assert not set(big[:2]) & _sampled(live)
    r = _post(live, {"label": "circle", "seeds": [str(x) for x in big[:2]], "keep": True})
    assert r.status_code == 200 and r.json()["changed"] == big[:2]
    assert set(big[:2]) <= _sampled(live)
    r = _post(live, {"label": "circle", "seeds": [str(seeds[11])], "keep": False})
    assert r.status_code == 404 and str(seeds[11]) in r.json()["error"]["message"]


@pytest.mark.parametrize("bad", ["", "12a", "-1", "+5", " 5", "5\n", "0123", "1e3", "1_000",
                                 "\u0665", str(SEED_MAX + 1), str(2**64)])
def test_a_seed_string_that_is_no_seed_is_a_422(live: LiveService, bad: str) -> None:
    before = _counts(live)
    r = _post(live, {"label": "circle", "seeds": [bad], "keep": False})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["field"] == "seeds"
    message = error["message"]
    assert "\n" not in message and repr(bad) in message  # one line, naming the value
    assert str(SEED_MAX) in message and "decimal string" in message  # the limit, the fix
    assert _counts(live) == before
    # The served schema says the same: a seed string is what its pattern admits.
    assert re.fullmatch(SEED_TEXT_PATTERN, bad) is None


def test_unknown_label_seeds_and_recipe_are_clear_4xx(live: LiveService, seeds: list[int]
                                                      ) -> None:
    s = seeds
    r = _post(live, {"label": "hexagon", "seeds": [s[0]], "keep": False})
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["field"] == "label" and "hexagon" in error["message"]
    assert "circle" in error["message"] and "square" in error["message"]

    before = _sampled(live)
    r = _post(live, {"label": "circle", "seeds": [s[0], s[10], s[11]], "keep": False})
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["field"] == "seeds" and f"{s[10]}, {s[11]}" in error["message"]
    assert "nothing was applied" in error["message"]
    assert _sampled(live) == before  # s[0] was not rejected

    r = _post(live, {"label": "circle", "seeds": list(range(501)), "keep": False})
    assert r.status_code == 422
    assert r.json()["error"]["field"] == "seeds" and "500" in r.json()["error"]["message"]
    r = _post(live, {"label": "circle", "seeds": [], "keep": False})
    assert r.status_code == 422 and r.json()["error"]["field"] == "seeds"
    r = _post(live, {"label": "circle", "seeds": [s[0]]})
    assert r.status_code == 422 and r.json()["error"]["field"] == "keep"
    r = httpx.post(live.url + "/v1/recipes/nope/verdicts",
                   json={"label": "circle", "seeds": [s[0]], "keep": False})
    assert r.status_code == 404 and "shapes" in r.json()["error"]["message"]


def test_listing_and_png(live: LiveService, seeds: list[int]) -> None:
    r = httpx.get(live.url + "/v1/recipes/shapes/images",
                  params={"label": "circle", "rejected": "true", "limit": 2, "offset": 1})
    assert r.status_code == 200, r.text
    page = r.json()
    assert page["total"] >= 4 and page["offset"] == 1 and len(page["images"]) == 2
    first = page["images"][0]
    assert first["accepted"] is False and first["rejected_by"] in ("judge", "person")
    assert first["score"] is not None and first["png"].endswith(f"/{first['seed_str']}.png")
    assert first["seed_str"] == str(first["seed"])
    png = httpx.get(live.url + first["png"])
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    pixels = np.asarray(Image.open(io.BytesIO(png.content)))
    assert pixels.shape == (32, 32, 3)
    assert pixels[0, 0, 0] == seeds.index(first["seed"]) * 20  # that image's own pixels

    accepted = httpx.get(live.url + "/v1/recipes/shapes/images", params={"label": "circle"})
    scores = [i["score"] for i in accepted.json()["images"]]
    assert scores == sorted(scores) and accepted.json()["accepted"] == len(scores)

    r = httpx.get(live.url + "/v1/recipes/shapes/images", params={"label": "hexagon"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "label"
    r = httpx.get(live.url + "/v1/recipes/shapes/images",
                  params={"label": "circle", "limit": 501})
    assert r.status_code == 422 and r.json()["error"]["field"] == "limit"
    r = httpx.get(live.url + f"/v1/recipes/shapes/images/circle/{seeds[11]}.png")
    assert r.status_code == 404 and r.json()["error"]["field"] == "seed"
    r = httpx.get(live.url + f"/v1/recipes/shapes/images/hexagon/{seeds[0]}.png")
    assert r.status_code == 422


def test_schema_declares_the_routes_per_recipe(live: LiveService) -> None:
    paths = httpx.get(live.url + "/openapi.json").json()["paths"]
    verdicts = paths["/v1/recipes/shapes/verdicts"]["post"]
    assert "requestBody" in verdicts and "404" in verdicts["responses"]
    listing = paths["/v1/recipes/shapes/images"]["get"]
    label = next(p for p in listing["parameters"] if p["name"] == "label")
    assert label["schema"]["enum"] == ["circle", "square", "triangle"]
    assert "image/png" in paths["/v1/recipes/shapes/images/{label}/{seed}.png"]["get"][
        "responses"]["200"]["content"]
    assert not any("{name}" in path for path in paths)
    # A seed is an integer or its decimal string, each bounded as the route bounds it.
    schemas = httpx.get(live.url + "/openapi.json").json()["components"]["schemas"]
    item = schemas["VerdictRequestShapes"]["properties"]["seeds"]["items"]
    integer, text = item["anyOf"]
    assert integer == {"type": "integer", "minimum": 0, "maximum": SEED_MAX}
    assert text["type"] == "string" and text["pattern"] == SEED_TEXT_PATTERN


def test_the_pool_page_is_served(live: LiveService) -> None:
    r = httpx.get(live.url + "/pool/shapes")
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
    assert "verdicts" in r.text and "seed_str" in r.text


def _page_line(r: httpx.Response) -> str:
    assert r.status_code == 404 and "text/html" in r.headers["content-type"], r.text
    found = re.search(r'<p id="error">(.*)</p>', r.text)
    assert found is not None, r.text
    return found.group(1)


def test_the_pool_page_of_an_unknown_recipe_is_a_404(live: LiveService) -> None:
    line = _page_line(httpx.get(live.url + "/pool/nope"))
    assert line == "no recipe named &#x27;nope&#x27;; this service has: shapes"
    # The name comes back escaped: a link cannot put a script into the page.
    line = _page_line(httpx.get(live.url + "/pool/%3Cscript%3Ealert(1)%3Cb%3E"))
    assert "<script>" not in line and "&lt;script&gt;" in line


def test_the_keyed_pool_page_404_keeps_the_recipe_names(
    make_service: Any, shapes_recipes_file: Path, tmp_path: Path
) -> None:
    """The page is open; with API keys set, /v1/recipes keeps the names behind a key, so the
    404 says where to find them instead of naming them."""
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pregenerate=False, api_keys=["k" * 32])
    line = _page_line(httpx.get(live.url + "/pool/nope"))
    assert "'nope'" in line.replace("&#x27;", "'") and "shapes" not in line
    assert "status page" in line
    assert httpx.get(live.url + "/pool/shapes").status_code == 200


def test_the_clients_reject_what_a_sample_returned(live: LiveService, seeds: list[int]
                                                   ) -> None:
    import asyncio

    from genaug.client import AsyncClient, Client
    from genaug.client.errors import NotFoundError

    with Client(live.url) as client:
        sample = client.sample("shapes", labels="circle", n=2)
        assert len(sample.seeds) == 2
        answer = client.verdict("shapes", "circle", sample.seeds, keep=False)
        assert sorted(answer["changed"]) == sorted(sample.seeds.tolist())
        assert not set(sample.seeds.tolist()) & _sampled(live)
        with pytest.raises(NotFoundError, match=str(seeds[11])):
            client.verdict("shapes", "circle", [seeds[11]], keep=True)

    async def restore() -> dict[str, Any]:
        async with AsyncClient(live.url) as client:
            return await client.verdict("shapes", "circle", sample.seeds, keep=True)

    assert sorted(asyncio.run(restore())["changed"]) == sorted(sample.seeds.tolist())
    assert set(sample.seeds.tolist()) <= _sampled(live)


def test_journey_docs_curation_flow(
    make_service: Any, shapes_recipes_file: Path, tmp_path: Path
) -> None:
    """docs/curation.md's "Verdicts" section as a user runs it, against a service that fills
    its own pool (the planner's 63-bit seeds): a sample's seeds rejected through the client,
    the answer's counts, the listing and a PNG over HTTP, samples that never return the
    rejects, a restore sent as the listing's seed strings (what the pool page sends), the
    all-or-nothing 404 and the key."""
    from genaug.client import Client
    from genaug.client.errors import NotFoundError

    key, capacity = "journey-key-" + "x" * 20, 16
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pregenerate=True, api_keys=[key], pool_capacity_per_label=capacity)
    auth = {"Authorization": f"Bearer {key}"}
    with Client(live.url, api_key=key) as client:
        sample = client.sample("shapes", labels="circle", n=capacity, wait_s=60)
        assert len(sample.seeds) == capacity
        rejects = [int(x) for x in sample.seeds[:2]]
        assert all(x > 2**53 for x in rejects)  # as the planner draws them

        # Reject: the answer says what changed and the label's counts now.
        answer = client.verdict("shapes", "circle", sample.seeds[:2], keep=False)
        assert answer["changed"] == rejects and answer["unchanged"] == []
        assert answer["rejected_by_person"] == 2 and answer["accepted"] == capacity - 2
        assert client.recipe("shapes")["per_label"]["circle"]["rejected_by_person"] == 2

        # Listing and PNG, as the doc's curl lines do.
        r = httpx.get(live.url + "/v1/recipes/shapes/images", headers=auth,
                      params={"label": "circle", "rejected": "true", "offset": 0, "limit": 50})
        assert r.status_code == 200, r.text
        listed = r.json()["images"]
        assert sorted(i["seed"] for i in listed) == sorted(rejects)
        assert {i["rejected_by"] for i in listed} == {"person"}
        png = httpx.get(live.url + listed[0]["png"], headers=auth)
        assert png.status_code == 200 and png.headers["content-type"] == "image/png"
        assert Image.open(io.BytesIO(png.content)).size == (32, 32)

        # Never sampled again; the planner makes replacements (the fill counts accepted).
        deadline = time.monotonic() + 60
        while client.recipe("shapes")["per_label"]["circle"]["accepted"] < capacity:
            assert time.monotonic() < deadline, "no replacements were made"
            time.sleep(0.2)
        again = client.sample("shapes", labels="circle", n=1024)
        assert not set(rejects) & set(again.seeds.tolist())

        # All or nothing: one unknown seed, nothing applied.
        with pytest.raises(NotFoundError, match="nothing was applied"):
            client.verdict("shapes", "circle", [rejects[0], 12345], keep=True)
        assert client.recipe("shapes")["per_label"]["circle"]["rejected_by_person"] == 2

        # Restore, with the seeds as the listing's strings (what the pool page sends).
        body = {"label": "circle", "seeds": [i["seed_str"] for i in listed], "keep": True}
        assert httpx.post(live.url + "/v1/recipes/shapes/verdicts", json=body).status_code == 401
        r = httpx.post(live.url + "/v1/recipes/shapes/verdicts", json=body, headers=auth)
        assert r.status_code == 200, r.text
        assert sorted(r.json()["changed"]) == sorted(rejects)
        assert r.json()["rejected_by_person"] == 0
        assert set(rejects) <= set(client.sample("shapes", labels="circle", n=1024).seeds.tolist())
