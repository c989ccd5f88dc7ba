"""The pool sample's hot path (``DirectSample``) answers exactly as the FastAPI route would:
behind the guard, with the app's error shapes and metrics, and only for the path it owns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from genaug.service.api.fastpath import DirectSample
from genaug.wire import decode_batch

SAMPLE = "/v1/recipes/shapes/sample"


def pool_service(make_service: Any, recipes: Path, **settings: Any) -> Any:
    """A service with ``recipes`` (the ``shapes_recipes_file`` fixture) and a small pool."""
    return make_service(recipes=recipes, pool_path=recipes.parent / "pool.db",
                        pool_capacity_per_label=2, **settings)


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("POST", "/v1/recipes/shapes/sample", "shapes"),
        ("POST", "/v1/recipes/a.b-c/sample", "a.b-c"),
        ("GET", "/v1/recipes/shapes/sample", None),  # 405 comes from the router
        ("POST", "/v1/recipes/shapes/sample/", None),  # the router's slash redirect
        ("POST", "/v1/recipes//sample", None),
        ("POST", "/v1/recipes/a/b/sample", None),
        ("POST", "/v1/recipes/shapes/fill", None),
        ("POST", "/v1/recipes/sample", None),
    ],
)
def test_only_the_exact_sample_route_takes_the_hot_path(
    method: str, path: str, expected: str | None
) -> None:
    scope = {"type": "http", "method": method, "path": path, "root_path": ""}
    assert DirectSample(app=None)._recipe(scope) == expected  # type: ignore[arg-type]
    # under a root path the router (which strips it) decides
    assert DirectSample(app=None)._recipe({**scope, "root_path": "/x"}) is None  # type: ignore[arg-type]


def test_the_guard_runs_before_the_hot_path(
    make_service: Any, shapes_recipes_file: Path
) -> None:
    live = pool_service(make_service, shapes_recipes_file, api_keys=["s3cret"],
                        max_body_bytes=1024)
    r = httpx.post(live.url + SAMPLE, json={"n": 1})
    assert r.status_code == 401 and r.json()["error"]["type"] == "unauthorized", r.text
    key = {"Authorization": "Bearer s3cret"}
    r = httpx.post(live.url + SAMPLE, json={"labels": ["circle"] * 200}, headers=key)
    assert r.status_code == 413 and "max_body_bytes 1024" in r.json()["error"]["message"]
    r = httpx.post(live.url + SAMPLE, json={"n": 1}, headers=key)
    assert r.status_code == 200, r.text
    assert len(decode_batch(r.content)) == int(r.headers["x-genaug-count"])
    assert live.metric("genaug_rejections_total", 'reason="auth"') == 1
    assert live.metric("genaug_rejections_total", 'reason="body_too_large"') == 1


def test_errors_keep_the_app_shapes_and_metrics(
    make_service: Any, shapes_recipes_file: Path
) -> None:
    live = pool_service(make_service, shapes_recipes_file)
    r = httpx.post(live.url + SAMPLE, json={"n": -1})
    assert r.status_code == 422 and r.json()["error"]["field"] == "n", r.text
    r = httpx.post(live.url + SAMPLE, json={"labels": ["hexagon"]})
    assert r.status_code == 422 and r.json()["error"]["field"] == "labels"
    r = httpx.post(live.url + "/v1/recipes/nope/sample", json={"n": 1})
    assert r.status_code == 404 and "shapes" in r.json()["error"]["message"]
    assert live.metric("genaug_rejections_total", 'reason="invalid"') == 2
    r = httpx.get(live.url + SAMPLE)
    assert r.status_code == 405 and r.json()["error"]["type"] == "method_not_allowed"
    assert live.metric("genaug_request_latency_seconds_count", 'route="sample"') == 0
    assert httpx.post(live.url + SAMPLE, json={"n": 0}).status_code == 200
    assert live.metric("genaug_request_latency_seconds_count", 'route="sample"') == 1


def test_an_unexpected_failure_is_a_500_with_an_error_id(
    make_service: Any, shapes_recipes_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = pool_service(make_service, shapes_recipes_file)

    async def broken(*args: Any) -> Any:
        raise RuntimeError("store exploded")

    monkeypatch.setattr(live.state.pools, "sample", broken)
    r = httpx.post(live.url + SAMPLE, json={"n": 1})
    assert r.status_code == 500, r.text
    error = r.json()["error"]
    assert error["type"] == "internal" and error["id"] in error["message"]
    assert "store exploded" not in r.text
