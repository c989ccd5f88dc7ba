"""Fill jobs through the real service: a fill answers a job, its status shows progress until
done, exactly one signed webhook reaches a receiver on 127.0.0.1, and after a restart on the
same pool the job still answers done. The bad inputs of the issue: an unknown id (404), a
notify_url outside the allowed hosts or not http(s) (422 naming the field and the setting), a
cancel of an ended job (409 saying its state)."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

SECRET = "s3cret-for-the-tests-0123456789"


class _Receiver:
    """A webhook receiver on 127.0.0.1: every POST's body and headers, in order."""

    def __init__(self) -> None:
        self.got: list[tuple[bytes, dict[str, str]]] = []
        self.arrived = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.got.append((body, {k.lower(): v for k, v in self.headers.items()}))
                outer.arrived.set()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/genaug"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    r = _Receiver()
    yield r
    r.close()


def _wait(get: Callable[[], dict[str, Any]], done: Callable[[dict[str, Any]], bool],
          timeout: float = 120.0) -> list[dict[str, Any]]:
    """Poll ``get`` until ``done``; every answer seen, in order."""
    seen = []
    deadline = time.monotonic() + timeout
    while True:
        seen.append(get())
        if done(seen[-1]):
            return seen
        assert time.monotonic() < deadline, f"not done in {timeout} s: {seen[-1]}"
        time.sleep(0.05)


def test_a_fill_with_notify_url_is_a_job_followed_to_done_told_once_and_kept_over_a_restart(
        make_service: Callable[..., Any], shapes_recipes_file: Path, tmp_path: Path,
        receiver: _Receiver) -> None:
    settings = dict(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                    pregenerate=False, max_batch_images=4,
                    webhook_hosts="127.0.0.1", webhook_secret=SECRET)
    live = make_service(**settings)
    r = httpx.post(f"{live.url}/v1/recipes/shapes/fill",
                   json={"per_label": 6, "notify_url": receiver.url}, timeout=30)
    assert r.status_code == 200, r.text
    answer = r.json()
    job_id = answer["job"]["id"]
    assert answer["job"]["url"] == f"/v1/jobs/{job_id}"
    assert answer["target_per_label"] == {"circle": 6, "square": 6, "triangle": 6}

    def get() -> dict[str, Any]:
        got = httpx.get(f"{live.url}/v1/jobs/{job_id}", timeout=30)
        assert got.status_code == 200, got.text
        return dict(got.json())

    seen = _wait(get, lambda job: job["state"] == "done")
    final = seen[-1]
    assert final["recipe"] == "shapes" and final["kind"] == "per_label"
    assert final["asked"] == 18 and final["missing"] == 0 and final["accepted"] >= 18
    assert all(label["met"] and label["fill"] >= 6 for label in final["labels"].values())
    assert final["ended"] is not None and final["eta_s"] == 0
    # Progress was visible on the way (the fill takes several batches of 4).
    assert any(0 < job["accepted"] < 18 for job in seen[:-1]), [j["accepted"] for j in seen]

    assert receiver.arrived.wait(30), "no webhook arrived"
    time.sleep(2.5)  # two more rounds of the job loop: nothing is sent twice
    assert len(receiver.got) == 1, receiver.got
    body, headers = receiver.got[0]
    expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(headers["x-genaug-signature"], expected)
    told = json.loads(body)
    assert told["id"] == job_id and told["state"] == "done"
    assert headers["x-genaug-delivery"] == job_id  # the same after a restart, on any replica
    assert told["labels"] == final["labels"]  # the body is the job as GET shows it
    delivered = _wait(get, lambda job: (job["webhook"] or {}).get("state") == "delivered")
    assert delivered[-1]["webhook"]["attempts"] == 1

    # A live job is listed with its recipe; an ended one is not, but GET /v1/jobs has it.
    assert httpx.get(f"{live.url}/v1/recipes/shapes", timeout=30).json()["jobs"] == []
    listed = httpx.get(f"{live.url}/v1/jobs", params={"recipe": "shapes"}, timeout=30).json()
    assert [job["id"] for job in listed["jobs"]] == [job_id]

    live.stop()
    again = make_service(**settings)  # the same pool file: the job is remembered
    after = httpx.get(f"{again.url}/v1/jobs/{job_id}", timeout=30)
    assert after.status_code == 200 and after.json()["state"] == "done"
    assert after.json()["labels"] == final["labels"]  # as it ended, not what came since
    time.sleep(1.5)
    assert len(receiver.got) == 1  # delivered before the restart: not sent again

    # Ended: cancelling it is a 409 that says its state.
    late = httpx.post(f"{again.url}/v1/jobs/{job_id}/cancel", timeout=30)
    assert late.status_code == 409 and "done" in late.text, late.text
    # Forgotten: answered as it was, then gone on every replica (a 404, not the same job).
    gone = httpx.delete(f"{again.url}/v1/jobs/{job_id}", timeout=30)
    assert gone.status_code == 200 and gone.json()["state"] == "done", gone.text
    after = httpx.get(f"{again.url}/v1/jobs/{job_id}", timeout=30)
    assert after.status_code == 404 and job_id in after.text
    assert httpx.delete(f"{again.url}/v1/jobs/{job_id}", timeout=30).status_code == 404


def test_cancel_releases_the_job_and_bad_input_is_refused_with_the_field(
        make_service: Callable[..., Any], shapes_recipes_file: Path, tmp_path: Path) -> None:
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pregenerate=False, max_batch_images=2,
                        webhook_hosts="hooks.example.com", webhook_secret=SECRET)
    assert live.worker is not None
    live.worker.gate.clear()  # nothing finishes: the job stays live while it is cancelled
    try:
        r = httpx.post(f"{live.url}/v1/recipes/shapes/fill", json={"per_label": 40},
                       timeout=30)
        job_id = r.json()["job"]["id"]
        detail = httpx.get(f"{live.url}/v1/recipes/shapes", timeout=30).json()
        assert [job["id"] for job in detail["jobs"]] == [job_id]
        assert detail["jobs"][0]["state"] in ("queued", "running")
        cancelled = httpx.post(f"{live.url}/v1/jobs/{job_id}/cancel", timeout=30)
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
        # Released: the targets fall back to what is held and in flight (below 40).
        targets = httpx.get(f"{live.url}/v1/recipes/shapes", timeout=30).json()
        assert all(t < 40 for t in targets["target_per_label"].values()), targets
        again = httpx.post(f"{live.url}/v1/jobs/{job_id}/cancel", timeout=30)
        assert again.status_code == 409 and "cancelled" in again.text
        # The cancelled job stays readable; a live one that is forgotten is cancelled first
        # (its targets released too) and is gone after.
        assert httpx.get(f"{live.url}/v1/jobs/{job_id}", timeout=30).json()["state"] == (
            "cancelled")
        other = httpx.post(f"{live.url}/v1/recipes/shapes/fill", json={"per_label": 50},
                           timeout=30).json()["job"]["id"]
        forgot = httpx.delete(f"{live.url}/v1/jobs/{other}", timeout=30)
        assert forgot.status_code == 200 and forgot.json()["state"] == "cancelled", forgot.text
        assert httpx.get(f"{live.url}/v1/jobs/{other}", timeout=30).status_code == 404
        targets = httpx.get(f"{live.url}/v1/recipes/shapes", timeout=30).json()
        assert all(t < 40 for t in targets["target_per_label"].values()), targets
        listed = httpx.get(f"{live.url}/v1/jobs", timeout=30).json()["jobs"]
        assert [j["id"] for j in listed] == [job_id]
    finally:
        live.worker.gate.set()

    unknown = httpx.get(f"{live.url}/v1/jobs/j_0000000000000000", timeout=30)
    assert unknown.status_code == 404 and "j_0000000000000000" in unknown.text
    # Each refusal says its own reason (never the schema's regular expression), and one
    # that is about the host names the allowed ones.
    for url, words in (
        ("http://127.0.0.1:9/hook", ["host 127.0.0.1:9 is not in GENAUG_WEBHOOK_HOSTS "
                                     "(hooks.example.com)"]),
        ("ftp://hooks.example.com/x", ["scheme 'ftp' is not http or https", "hooks.example.com"]),
        ("https://user:pw@hooks.example.com/x", ["carries credentials"]),
        ("https://hooks.example.com/x#top", ["has a fragment"]),
        ("https://hooks.example.com:99999/x", ["is not a valid URL", "hooks.example.com"]),
        (7, ["Input should be a valid string", "(hooks.example.com)"]),
    ):
        bad = httpx.post(f"{live.url}/v1/recipes/shapes/fill",
                         json={"per_label": 1, "notify_url": url}, timeout=30)
        assert bad.status_code == 422, bad.text
        error = bad.json()["error"]
        assert error["field"] == "notify_url" and "pattern" not in error["message"], error
        assert all(word in error["message"] for word in words), error
    # What docs/webhooks.md says is accepted and normalised is accepted (the served schema
    # admits it too), and the job keeps the normal form.
    for url, normal in (("HTTPS://Hooks.Example.COM./a?job=1", "https://hooks.example.com/a?job=1"),
                        ("http://HOOKS.example.com:8080", "http://hooks.example.com:8080/")):
        ok = httpx.post(f"{live.url}/v1/recipes/shapes/fill",
                        json={"per_label": 1, "notify_url": url}, timeout=30)
        assert ok.status_code == 200, ok.text
        job = httpx.get(f"{live.url}{ok.json()['job']['url']}", timeout=30).json()
        assert job["notify_url"] == normal, job
        schema = httpx.get(f"{live.url}/openapi.json", timeout=30).json()
        pattern = schema["components"]["schemas"]["FillRequestShapes"]["properties"][
            "notify_url"]["pattern"]
        assert re.fullmatch(pattern, url), (pattern, url)
    state = httpx.get(f"{live.url}/v1/jobs", params={"state": "finished"}, timeout=30)
    assert state.status_code == 422 and "state" in state.text


def test_without_allowed_hosts_a_notify_url_is_refused_naming_the_setting(
        make_service: Callable[..., Any], shapes_recipes_file: Path, tmp_path: Path) -> None:
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pregenerate=False)
    bad = httpx.post(f"{live.url}/v1/recipes/shapes/fill",
                     json={"per_label": 1, "notify_url": "http://127.0.0.1:9/hook"},
                     timeout=30)
    assert bad.status_code == 422
    message = bad.json()["error"]["message"]
    # Off says off, and which setting turns them on; never a URL form that cannot pass.
    assert "webhooks are off on this service" in message, message
    assert "GENAUG_WEBHOOK_HOSTS" in message and "GENAUG_WEBHOOK_SECRET" in message, message
    assert "send an http" not in message and "pattern" not in message, message


def test_a_running_jobs_updated_moves_with_each_image_it_counts(
        make_service: Callable[..., Any], shapes_recipes_file: Path, tmp_path: Path) -> None:
    """``updated`` is when the job last changed: a state, or an image it counts (not only a
    state: a job that runs for 15 minutes said the same ``updated`` all along). One batch of
    2 images at a time is let through the pipeline."""
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pregenerate=False, max_batch_images=2)
    worker = live.worker
    assert worker is not None
    get = lambda: httpx.get(f"{live.url}/v1/jobs/{job_id}", timeout=30).json()  # noqa: E731

    def let_one_batch_through() -> None:
        worker.entered.clear()
        worker.gate.set()  # the held batch goes (a waiter woken by set() runs even if ...
        worker.gate.clear()  # ... the gate closes again at once): the next one is held
        assert worker.entered.wait(30)

    worker.gate.clear()
    try:
        r = httpx.post(f"{live.url}/v1/recipes/shapes/fill", json={"per_label": 4}, timeout=30)
        job_id = r.json()["job"]["id"]
        assert worker.entered.wait(30)  # the first batch is held
        let_one_batch_through()
        first = _wait(get, lambda j: j["accepted"] >= 2)[-1]
        let_one_batch_through()
        second = _wait(get, lambda j: j["accepted"] >= 4)[-1]
    finally:
        worker.gate.set()
    assert first["state"] == second["state"] == "running", (first, second)
    assert first["created"] < first["updated"] < second["updated"], (first, second)
    assert second["ended"] is None


def test_an_unknown_recipe_or_query_parameter_is_named_not_silently_ignored(
        make_service: Callable[..., Any], shapes_recipes_file: Path, tmp_path: Path) -> None:
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pregenerate=False)
    jobs = f"{live.url}/v1/jobs"
    typo = httpx.get(jobs, params={"recipe": "shapez"}, timeout=30)
    assert typo.status_code == 404, typo.text
    assert typo.json()["error"]["field"] == "recipe"
    assert "no such recipe" in typo.text and "this service has: shapes" in typo.text
    for url, params, allowed in (
        (jobs, {"recipes": "shapes"}, "recipe, state, limit"),
        (f"{live.url}/v1/recipes/shapes/images", {"label": "circle", "offest": "5"},
         "label, rejected, offset, limit"),
    ):
        unknown = httpx.get(url, params=params, timeout=30)
        assert unknown.status_code == 422, unknown.text
        bad = next(name for name in params if name not in allowed)
        assert unknown.json()["error"] == {
            "type": "invalid_request", "field": bad,
            "message": f"unknown query parameter {bad!r}; remove it (allowed: {allowed})"}
    # A job of a recipe this service no longer serves (a replica's, an old spec's) is still
    # listed by that name.
    old = live.state.require_fill_jobs().queries.create(
        "retired-0123456789ab", "retired", "per_label", {"a": 1})
    listed = httpx.get(jobs, params={"recipe": "retired"}, timeout=30)
    assert listed.status_code == 200 and [j["id"] for j in listed.json()["jobs"]] == [old.id]
    assert httpx.get(jobs, params={"recipe": "shapes"}, timeout=30).json() == {"jobs": []}
