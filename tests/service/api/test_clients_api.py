"""``GET /v1/clients`` lists every client, including trainers that only sample pools.

A live tiny service fills its own recipe pool (pre-generation), real
:class:`genaug.client.Client` instances with their own ``client_id`` sample it, and the
listing counts each one's samples (requests, images served, recipes, last seen) beside
its generation, per API key then client id when keys are set.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from genaug.client import Client
from genaug.service.testing import LiveService

KEY = "clients-listing-test-key"


def filled(live: LiveService, recipe: str = "shapes") -> dict[str, int]:
    """Wait until the service's own pre-generation put an image in every label."""
    def fill() -> dict[str, int]:
        r = httpx.get(f"{live.url}/v1/recipes/{recipe}", headers=live.headers(), timeout=10)
        r.raise_for_status()
        return dict(r.json()["fill"])

    live.wait_until(lambda: all(n > 0 for n in fill().values()), timeout=90,
                    what="every label of the pool holding an image")
    return fill()


def sample_twice(live: LiveService, client_id: str, n: int, **options: Any) -> int:
    """Two samples by a real client with its own ``client_id``: the images served."""
    with Client(live.url, client_id=client_id, **options) as client:
        return sum(len(client.sample("shapes", n=n)) for _ in range(2))


def test_sampling_only_trainers_are_listed_with_their_samples(
    make_service: Any, tmp_path: Path, shapes_recipes_file: Path
) -> None:
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=3, max_batch_images=8)
    filled(live)
    before = time.time()
    served = {"trainer-a": sample_twice(live, "trainer-a", n=4),
              "trainer-b": sample_twice(live, "trainer-b", n=2)}
    after = time.time()
    assert served["trainer-a"] > 0 and served["trainer-b"] > 0

    clients = live.clients()
    for name, images in served.items():
        report = clients[name]
        assert (report["samples"], report["sampled_images"]) == (2, images), report
        assert report["sampled_recipes"] == ["shapes"]
        assert (report["requests"], report["images"], report["generation_s"]) == (0, 0, 0.0)
        assert before - 1 <= report["last_seen"] <= after + 1
        assert 0 <= report["last_seen_ago_s"] < 60
    # the pool's own pre-generation is listed as before, and samples nothing
    assert clients["(pool pre-generation)"]["samples"] == 0
    assert clients["(pool pre-generation)"]["images"] > 0


def test_under_api_keys_samples_count_per_key_then_client_id(
    make_service: Any, tmp_path: Path, shapes_recipes_file: Path
) -> None:
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=3, max_batch_images=8, api_keys=[KEY])
    filled(live)
    served = {c: sample_twice(live, c, n=3, api_key=KEY) for c in ("trainer-a", "trainer-b")}
    with Client(live.url, client_id="notebook", api_key=KEY) as notebook:
        notebook.generate("a red square", n=1, steps=2, seed=5_170_473_398_412_338_611)
        notebook.sample("shapes", n=1)

    clients = live.clients()
    key = next(name.split("/")[0] for name in clients if name.endswith("/trainer-a"))
    assert key.startswith("key-") and KEY not in str(clients)  # the key is never echoed
    for name, images in served.items():
        report = clients[f"{key}/{name}"]
        assert (report["samples"], report["sampled_images"]) == (2, images), report
        assert report["requests"] == 0
    both = clients[f"{key}/notebook"]
    assert (both["requests"], both["images"], both["samples"]) == (1, 1, 1), both
    assert both["generation_s"] > 0 and both["last_seen"] is not None


def test_a_malformed_client_id_on_sample_is_refused_naming_the_header(
    make_service: Any, tmp_path: Path, shapes_recipes_file: Path
) -> None:
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pregenerate=False)
    # genaug's clients refuse such an id when they are made; another HTTP client sends it
    answer = httpx.post(live.url + "/v1/recipes/shapes/sample", json={"n": 1}, timeout=30,
                        headers={"X-Client-Id": "trainer a (GPU 0)"})
    assert answer.status_code == 422 and answer.json()["error"]["field"] == "X-Client-Id"
    assert "trainer a (GPU 0)" not in live.clients()
    with pytest.raises(ValueError, match="such as 'trainer-a-GPU-0'"):
        Client(live.url, client_id="trainer a (GPU 0)")
    # the schema says so: the sample operation takes the header, with its pattern
    doc = httpx.get(live.url + "/openapi.json", timeout=30).json()
    operation = doc["paths"]["/v1/recipes/shapes/sample"]["post"]
    assert {p["name"] for p in operation["parameters"]} == {"X-Client-Id"}
