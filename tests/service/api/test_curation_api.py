"""The curation routes on a real service (uvicorn on 127.0.0.1, real httpx): verdicts, the
image listing, one image's PNG, and the per-label counts of ``GET /v1/recipes/{name}``.

The pool is seeded through the service's own store (images with judge scores, some below the
judge's bar), as the planner stores them; nothing is generated (``pregenerate=False``).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from genaug.service.testing import LiveService, start_service
from genaug.wire import decode_batch

SEEDS = list(range(700, 710))
SCORES = [0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.3, 0.2, 0.1, 0.05]


@pytest.fixture(scope="module")
def live(tiny_model: Any, tmp_path_factory: pytest.TempPathFactory,
         shapes_recipe: str) -> Iterator[LiveService]:
    root: Path = tmp_path_factory.mktemp("curation")
    (root / "recipes.yaml").write_text(shapes_recipe)
    with start_service(tiny_model, recipes=root / "recipes.yaml", pool_path=root / "pool.db",
                       pregenerate=False) as live:
        pools = live.state.pools
        assert pools is not None
        images = np.zeros((10, 32, 32, 3), np.uint8)
        images[..., 0] = np.arange(10)[:, None, None] * 20
        pools.store.add(pools.pool_ids["shapes"], "circle", images, SEEDS, model_hash="m",
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


def test_judge_rejected_are_counted_and_never_sampled(live: LiveService) -> None:
    assert _counts(live) == {"fill": 6, "accepted": 6, "rejected": 4, "rejected_by_person": 0,
                             "judged_total": 10, "accepted_total": 6}
    assert _sampled(live) == set(SEEDS[:6])


def test_reject_and_restore(live: LiveService) -> None:
    r = _post(live, {"label": "circle", "seeds": [701, 703], "keep": False})
    assert r.status_code == 200, r.text
    assert r.json() == {"recipe": "shapes", "label": "circle", "keep": False,
                        "changed": [701, 703], "unchanged": [], "accepted": 4, "rejected": 4,
                        "rejected_by_person": 2}
    assert _sampled(live) == {700, 702, 704, 705}
    assert _counts(live)["rejected_by_person"] == 2
    r = _post(live, {"label": "circle", "seeds": [701, 708, 703], "keep": True})
    assert r.status_code == 200, r.text
    assert r.json()["changed"] == [701, 708, 703] and r.json()["accepted"] == 7
    assert _sampled(live) == {700, 701, 702, 703, 704, 705, 708}
    r = _post(live, {"label": "circle", "seeds": [708], "keep": False})  # undo the restore
    assert r.json()["changed"] == [708] and r.json()["accepted"] == 6
    r = _post(live, {"label": "circle", "seeds": [705.0], "keep": True})  # JSON's integer
    assert r.status_code == 200 and r.json()["unchanged"] == [705]


def test_unknown_label_seeds_and_recipe_are_clear_4xx(live: LiveService) -> None:
    r = _post(live, {"label": "hexagon", "seeds": [700], "keep": False})
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["field"] == "label" and "hexagon" in error["message"]
    assert "circle" in error["message"] and "square" in error["message"]

    before = _sampled(live)
    r = _post(live, {"label": "circle", "seeds": [700, 12345, 999], "keep": False})
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["field"] == "seeds" and "12345, 999" in error["message"]
    assert "nothing was applied" in error["message"]
    assert _sampled(live) == before  # 700 was not rejected

    r = _post(live, {"label": "circle", "seeds": list(range(501)), "keep": False})
    assert r.status_code == 422
    assert r.json()["error"]["field"] == "seeds" and "500" in r.json()["error"]["message"]
    r = _post(live, {"label": "circle", "seeds": [], "keep": False})
    assert r.status_code == 422 and r.json()["error"]["field"] == "seeds"
    r = _post(live, {"label": "circle", "seeds": [700]})
    assert r.status_code == 422 and r.json()["error"]["field"] == "keep"
    r = httpx.post(live.url + "/v1/recipes/nope/verdicts",
                   json={"label": "circle", "seeds": [700], "keep": False})
    assert r.status_code == 404 and "shapes" in r.json()["error"]["message"]


def test_listing_and_png(live: LiveService) -> None:
    r = httpx.get(live.url + "/v1/recipes/shapes/images",
                  params={"label": "circle", "rejected": "true", "limit": 2, "offset": 1})
    assert r.status_code == 200, r.text
    page = r.json()
    assert page["total"] >= 4 and page["offset"] == 1 and len(page["images"]) == 2
    first = page["images"][0]
    assert first["accepted"] is False and first["rejected_by"] in ("judge", "person")
    assert first["score"] is not None and first["png"].endswith(f"/{first['seed']}.png")
    png = httpx.get(live.url + first["png"])
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    pixels = np.asarray(Image.open(io.BytesIO(png.content)))
    assert pixels.shape == (32, 32, 3) and pixels[0, 0, 0] == (first["seed"] - 700) * 20

    accepted = httpx.get(live.url + "/v1/recipes/shapes/images", params={"label": "circle"})
    scores = [i["score"] for i in accepted.json()["images"]]
    assert scores == sorted(scores) and accepted.json()["accepted"] == len(scores)

    r = httpx.get(live.url + "/v1/recipes/shapes/images", params={"label": "hexagon"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "label"
    r = httpx.get(live.url + "/v1/recipes/shapes/images",
                  params={"label": "circle", "limit": 501})
    assert r.status_code == 422 and r.json()["error"]["field"] == "limit"
    r = httpx.get(live.url + "/v1/recipes/shapes/images/circle/4242.png")
    assert r.status_code == 404 and r.json()["error"]["field"] == "seed"
    r = httpx.get(live.url + "/v1/recipes/shapes/images/hexagon/700.png")
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


def test_the_pool_page_is_served(live: LiveService) -> None:
    r = httpx.get(live.url + "/pool/shapes")
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
    assert "verdicts" in r.text


def test_the_clients_reject_what_a_sample_returned(live: LiveService) -> None:
    import asyncio

    from genaug.client import AsyncClient, Client
    from genaug.client.errors import NotFoundError

    with Client(live.url) as client:
        sample = client.sample("shapes", labels="circle", n=2)
        assert len(sample.seeds) == 2
        answer = client.verdict("shapes", "circle", sample.seeds, keep=False)
        assert sorted(answer["changed"]) == sorted(sample.seeds.tolist())
        assert not set(sample.seeds.tolist()) & _sampled(live)
        with pytest.raises(NotFoundError, match="4242"):
            client.verdict("shapes", "circle", [4242], keep=True)

    async def restore() -> dict[str, Any]:
        async with AsyncClient(live.url) as client:
            return await client.verdict("shapes", "circle", sample.seeds, keep=True)

    assert sorted(asyncio.run(restore())["changed"]) == sorted(sample.seeds.tolist())
    assert set(sample.seeds.tolist()) <= _sampled(live)
