"""The status page (``GET /``) in a real browser: headless Debian Chromium via Playwright.

The page is loaded from a live tiny service that has served requests and filled a recipe
pool that trainers sample (each listed with its samples, as a generating client is); the
tests read what the page rendered and compare it with the JSON API. A screenshot
lands in ``artifacts/status-page.png`` (git-ignored) for a human to look at.

Chromium comes from the distribution (``apt-get install chromium``), never from
``playwright install``. Without it the tests skip locally; under CI (``CI`` set) they fail,
because CI installs it.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from genaug.client import Client

ROOT = Path(__file__).resolve().parents[3]
RECIPES = ROOT / "recipes" / "wound_phases.yaml"
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
KEY = "status-page-test-key"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must provide it (.ci/run installs chromium and playwright)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        _unavailable(f"{CHROMIUM} is absent (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install playwright)")
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        yield browser
        browser.close()


class Console:
    """Collects console errors and uncaught exceptions of one page."""

    def __init__(self, page: Any) -> None:
        self.errors: list[str] = []
        page.on("console", self._message)
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))

    def _message(self, msg: Any) -> None:
        if msg.type in ("error", "assert"):
            self.errors.append(f"console.{msg.type}: {msg.text}")


def wait_pool(url: str, headers: dict[str, str], timeout: float = 90) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        recipes = httpx.get(url + "/v1/recipes", headers=headers).json()["recipes"]
        fill = recipes[0]["fill"]
        if all(v > 0 for v in fill.values()):
            return dict(fill)
        assert time.monotonic() < deadline, f"pool did not fill: {fill}"
        time.sleep(0.2)


def page_state(page: Any) -> dict[str, Any]:
    return dict(page.evaluate(
        """() => {
          const t = (id) => document.getElementById(id).textContent.trim();
          const rows = {};
          for (const tr of document.querySelectorAll('#clients-body tr[data-client]')) {
            rows[tr.dataset.client] = {
              requests: Number(tr.querySelector('.requests').textContent),
              images: Number(tr.querySelector('.images').textContent),
              samples: Number(tr.querySelector('.samples').textContent),
              sampled_images: Number(tr.querySelector('.sampled-images').textContent),
              recipes: tr.querySelector('.sampled-recipes').textContent,
              last_seen: tr.querySelector('.last-seen').textContent,
            };
          }
          const pools = {};
          for (const box of document.querySelectorAll('#pools [data-recipe]')) {
            const fill = {};
            for (const row of box.querySelectorAll('[data-label]')) {
              fill[row.dataset.label] = Number(row.querySelector('.fill-count').textContent);
            }
            pools[box.dataset.recipe] = fill;
          }
          const img = document.getElementById('recent-img');
          return {
            hash: t('model-hash'), kind: t('model-kind'), device: t('device'),
            dtype: t('dtype'), ready: t('ready'), queue: t('queue-images'),
            clients: rows, pools: pools,
            bars: document.querySelectorAll('#throughput-chart rect').length,
            recent_width: img.hidden ? 0 : img.naturalWidth,
            error: t('error'),
            auth_visible: getComputedStyle(document.getElementById('auth')).display !== 'none',
          };
        }"""
    ))


LOADED = "() => document.body.dataset.loaded === '1' && " \
         "document.getElementById('recent-img').naturalWidth > 0"


def test_status_page_shows_live_numbers(make_service: Any, tmp_path: Path, browser: Any) -> None:
    live = make_service(recipes=RECIPES, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=3, max_batch_images=8)
    with Client(live.url, client_id="notebook-a") as client:
        for seed in (1, 2):
            client.generate("a red square", n=2, steps=2, seed=seed)
    fill = wait_pool(live.url, {})
    # Two trainers that only sample the pool: listed beside the one that generates.
    sampled: dict[str, int] = {}
    for trainer, n in (("trainer-a", 6), ("trainer-b", 2)):
        with Client(live.url, client_id=trainer) as client:
            sampled[trainer] = sum(len(client.sample("wound-phases", n=n)) for _ in range(3))
    info = httpx.get(live.url + "/v1/info").json()

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    console = Console(page)
    try:
        page.goto(live.url + "/")
        page.wait_for_function(LOADED, timeout=20_000)
        state = page_state(page)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "status-page.png"), full_page=True)
        # a second refresh cycle (2 s) runs without errors either
        page.wait_for_timeout(2500)
        assert page_state(page)["hash"] == info["model"]["hash"]
    finally:
        page.close()

    assert state["hash"] == info["model"]["hash"] and state["hash"] not in ("", "\u2013")
    assert state["kind"] == info["model"]["kind"]
    assert (state["device"], state["dtype"]) == (info["device"]["name"], info["model"]["dtype"])
    assert state["ready"] == "ready"
    assert state["queue"].isdigit()
    notebook = state["clients"]["notebook-a"]
    assert (notebook["requests"], notebook["images"], notebook["samples"]) == (2, 4, 0), notebook
    for trainer, images in sampled.items():
        row = state["clients"][trainer]
        assert images > 0 and row["last_seen"].endswith(" ago"), row
        assert row == {"requests": 0, "images": 0, "samples": 3, "sampled_images": images,
                       "recipes": "wound-phases", "last_seen": row["last_seen"]}, row
    pool = state["pools"]["wound-phases"]
    assert set(pool) == {"I", "P", "R"}
    assert all(n > 0 for n in pool.values()), pool
    assert all(pool[label] >= fill[label] for label in fill)  # the page is at least as fresh
    assert state["bars"] > 0
    assert state["recent_width"] > 0
    assert state["error"] in ("", "\u2013") and not state["auth_visible"]
    assert console.errors == []


def test_status_page_before_any_image(make_service: Any, browser: Any) -> None:
    live = make_service(max_batch_images=8)
    assert httpx.get(live.url + "/v1/recent.png").status_code == 204
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    console = Console(page)
    try:
        page.goto(live.url + "/")
        page.wait_for_function("() => document.body.dataset.loaded === '1'", timeout=20_000)
        page.wait_for_timeout(2500)  # one more refresh
        state = page_state(page)
        empty = page.is_visible("#recent-empty")
    finally:
        page.close()
    assert state["ready"] == "ready" and state["clients"] == {} and state["pools"] == {}
    assert state["recent_width"] == 0 and empty
    assert console.errors == []


def test_status_page_first_paint_says_what_is_true(
    make_service: Any, tmp_path: Path, browser: Any
) -> None:
    # Before its first poll answers (here: never), the page already says what exists: no
    # "nothing generated yet" beside a broken image while a pool holds images.
    live = make_service(recipes=RECIPES, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=3, max_batch_images=8)
    wait_pool(live.url, {})
    html = httpx.get(live.url + "/").text
    recent = re.search(r'<div id="recent-empty"[^>]*>([^<]*)</div>', html)
    pools = re.search(r'<div id="pools-body"[^>]*>([^<]*)</div>', html)
    assert recent is not None and pools is not None
    assert re.fullmatch(r"loading the \d+ most recent images…", recent.group(1)), recent
    assert pools.group(1) == "loading the pools of 1 recipe(s)…", pools
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        page.route("**/v1/status", lambda route: route.abort())
        page.goto(live.url + "/")
        page.wait_for_selector("#error:not(:empty)", timeout=20_000)  # the poll failed
        assert not page.is_visible("#recent-img")  # no empty (broken) image
        said = page.text_content("#recent-empty") or ""
        assert "most recent images" in said, said
    finally:
        page.close()
    # the same page with no image anywhere says so
    empty = make_service(max_batch_images=8)
    assert '<div id="recent-empty" class="muted">nothing generated yet</div>' in httpx.get(
        empty.url + "/").text


def test_status_page_asks_for_the_key(make_service: Any, browser: Any) -> None:
    live = make_service(api_keys=[KEY], max_batch_images=8)
    headers = {"Authorization": f"Bearer {KEY}"}
    with Client(live.url, api_key=KEY, client_id="keyed") as client:
        client.generate("a blue circle", n=1, steps=2, seed=3)
    info = httpx.get(live.url + "/v1/info", headers=headers).json()

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    console = Console(page)
    try:
        page.goto(live.url + "/")
        page.wait_for_selector("#auth.shown", timeout=10_000)
        assert not page.is_visible("#dashboard")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "status-page-key.png"))
        page.fill("#api-key", "wrong-key")
        page.click("#api-key-submit")
        page.wait_for_function(
            "() => document.getElementById('auth-message').textContent.includes('not accepted')",
            timeout=10_000,
        )
        page.fill("#api-key", KEY)
        page.click("#api-key-submit")
        page.wait_for_function(LOADED, timeout=20_000)
        state = page_state(page)
        stored = page.evaluate("() => sessionStorage.getItem('genaug-api-key')")
        # a reload keeps the key for this tab
        page.reload()
        page.wait_for_function(LOADED, timeout=20_000)
        assert not page_state(page)["auth_visible"]
    finally:
        page.close()

    assert stored == KEY
    assert state["hash"] == info["model"]["hash"]
    assert not state["auth_visible"]
    keyed = state["clients"][next(c for c in state["clients"] if c.endswith("/keyed"))]
    assert (keyed["requests"], keyed["images"], keyed["samples"]) == (1, 1, 0), keyed
    assert state["recent_width"] > 0
    # Only the unauthenticated / wrong-key requests may show up, as failed loads.
    unexpected = [e for e in console.errors if "401" not in e]
    assert unexpected == []


def test_status_page_shows_the_trainers_need(
    make_service: Any, tmp_path: Path, browser: Any, shapes_recipes_file: Path
) -> None:
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pregenerate=False, need_half_life_s=86_400)  # no decay while we look
    with Client(live.url, client_id="trainer-a") as client:
        client.feedback("shapes", {"triangle": 3.0, "square": 1.0})
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    console = Console(page)
    try:
        page.goto(live.url + "/")
        page.wait_for_function("() => document.body.dataset.loaded === '1'", timeout=20_000)
        need = page.evaluate(
            """() => Object.fromEntries([...document.querySelectorAll(
                 '#pools [data-recipe="shapes"] [data-label]')].map((row) => [
                 row.dataset.label, row.querySelector('.need').textContent]))"""
        )
    finally:
        page.close()
    assert need == {"circle": "", "square": "need 25%", "triangle": "need 75%"}
    assert console.errors == []
