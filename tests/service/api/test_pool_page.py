"""The pool page (``GET /pool/{name}``) in a real browser: headless Debian Chromium via
Playwright, on a live tiny service with API keys.

The pool is filled the way a service fills its own: ``POST /v1/recipes/shapes/fill`` runs the
service's planner and the tiny pipeline, so every image has a 63-bit seed as the planner draws
it (above 2**53, where JavaScript numbers lose digits: the page must use the listing's
``seed_str``). One label also holds judged squares, some below the judge's bar, stored as the
planner stores a judged batch (its next plan seeds, with scores); their drawings make the
screenshot check meaningful. The test goes from the status page to the pool page by its link
(the key entered once), checks that every thumbnail of the first page loads and every seed
fits its cell, pages through a label, rejects an image with a click and checks through the API
that it is rejected by a person and never sampled, then restores it. A screenshot lands in
``artifacts/pool-page.png`` (git-ignored) and is checked: its size, that it is not blank, and
that it shows the thumbnails the page lists.
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image
from test_status_page import ARTIFACTS, KEY, Console, browser  # noqa: F401 (fixture)

from genaug.wire import decode_batch

PER_PAGE = 24
N_FILL = 50  # per label, by the planner: three pages of circles
N_JUDGED = 30  # judged squares after those, 10 of them below the judge's bar
JS_EXACT = 2**53  # the largest integer a JavaScript number holds exactly (and all below it)


def _squares(n: int) -> np.ndarray:
    """n distinct 32x32 RGB drawings: a square of varying size and colour."""
    rng = np.random.default_rng(2)
    yy, xx = np.mgrid[:32, :32]
    out = np.full((n, 32, 32, 3), 235, np.uint8)
    for k in range(n):
        r = 5 + k % 9
        out[k][(abs(yy - 16) <= r) & (abs(xx - 16) <= r)] = rng.integers(30, 200, 3)
    return out


def _fill_pool(live: Any, headers: dict[str, str]) -> list[int]:
    """Every label filled to N_FILL by the service's planner, then N_JUDGED judged squares at
    the square plan's next indices; returns those squares' seeds."""
    r = httpx.post(live.url + "/v1/recipes/shapes/fill", headers=headers,
                   json={"per_label": N_FILL})
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 60
    while True:
        fill = httpx.get(live.url + "/v1/recipes/shapes", headers=headers).json()["fill"]
        if all(v >= N_FILL for v in fill.values()):
            break
        assert time.monotonic() < deadline, f"the fill did not finish: {fill}"
        time.sleep(0.2)
    pools = live.state.pools
    recipe = live.state.recipes["shapes"]
    seeds = [item.seed for item in recipe.plan_batch("square", N_FILL, N_JUDGED)]
    pools.store.add(pools.pool_ids["shapes"], "square", _squares(N_JUDGED), seeds,
                    model_hash=pools.planner.model_hash,
                    scores=np.linspace(0.0, 1.0, N_JUDGED), keep=np.arange(N_JUDGED) >= 10,
                    next_index=N_FILL + N_JUDGED)
    return seeds


def _range(page: Any, label: str) -> str:
    return str(page.text_content(f'section[data-label="{label}"] .range')).strip()


def _wait_thumbnails(page: Any, label: str, count: int) -> None:
    page.wait_for_function(
        f"""() => {{
          const cells = document.querySelectorAll('section[data-label="{label}"] .cell');
          const loaded = document.querySelectorAll(
            'section[data-label="{label}"] .cell img[data-loaded="1"]');
          return cells.length === {count} && loaded.length === {count};
        }}""", timeout=20_000)


def _cells(page: Any, label: str) -> list[dict[str, Any]]:
    """Per cell of a label: its seed as the page holds it, the seed it shows, whether its
    thumbnail has pixels, and whether its content fits its width."""
    cells: list[dict[str, Any]] = page.eval_on_selector_all(
        f'section[data-label="{label}"] .cell',
        """cells => cells.map(c => {
             const seed = c.querySelector('.seed');
             return {seed: c.dataset.seed, shown: seed.textContent,
                     width: c.querySelector('img').naturalWidth,
                     fits: c.scrollWidth <= c.clientWidth &&
                           seed.getBoundingClientRect().right <=
                           c.getBoundingClientRect().right};
           })""")
    return cells


def _listed(url: str, headers: dict[str, str], **params: Any) -> list[dict[str, Any]]:
    r = httpx.get(url + "/v1/recipes/shapes/images", headers=headers,
                  params={"limit": PER_PAGE, **params})
    assert r.status_code == 200, r.text
    images: list[dict[str, Any]] = r.json()["images"]
    return images


def _circle_counts(url: str, headers: dict[str, str], *, accepted: int) -> dict[str, Any]:
    """The circle label's counts in the recipe's detail, once it holds ``accepted`` images."""
    deadline = time.monotonic() + 30
    while True:
        counts: dict[str, Any] = httpx.get(url + "/v1/recipes/shapes", headers=headers).json()[
            "per_label"]["circle"]
        if counts["accepted"] == accepted:
            return counts
        assert time.monotonic() < deadline, f"circle never held {accepted} images: {counts}"
        time.sleep(0.1)


def _sampled(url: str, headers: dict[str, str]) -> set[int]:
    seen: set[int] = set()
    for _ in range(3):
        r = httpx.post(url + "/v1/recipes/shapes/sample", headers=headers,
                       json={"labels": ["circle"], "n": 1024})
        assert r.status_code == 200, r.text
        seen |= set(decode_batch(r.content).seeds.tolist())
    return seen


def test_pool_page_pages_rejects_and_restores(
    make_service: Any, shapes_recipes_file: Path, tmp_path: Path, browser: Any  # noqa: F811
) -> None:
    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pregenerate=False, api_keys=[KEY])
    headers = {"Authorization": f"Bearer {KEY}"}
    _fill_pool(live, headers)
    first = _listed(live.url, headers, label="circle")
    # The planner's seeds are the ones a browser cannot read as numbers.
    assert sum(int(i["seed_str"]) > JS_EXACT for i in first) >= PER_PAGE - 2
    assert all(i["seed_str"] == str(i["seed"]) for i in first)
    assert httpx.post(live.url + "/v1/recipes/shapes/verdicts",  # keys protect verdicts
                      json={"label": "circle", "seeds": [first[0]["seed"]],
                            "keep": False}).status_code == 401

    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    console = Console(page)
    try:
        # The status page links each recipe's pool page; the key entered there is kept.
        page.goto(live.url + "/")
        page.wait_for_selector("#auth.shown", timeout=10_000)
        page.fill("#api-key", KEY)
        page.click("#api-key-submit")
        page.wait_for_selector('a.pool-link[href="pool/shapes"]', timeout=20_000)
        page.click('a.pool-link[href="pool/shapes"]')
        page.wait_for_url("**/pool/shapes", timeout=10_000)
        page.wait_for_function("() => document.body.dataset.loaded === '1'", timeout=20_000)
        assert not page.is_visible("#auth")

        labels = page.eval_on_selector_all("section[data-label]",
                                           "s => s.map(x => x.dataset.label)")
        assert labels == ["circle", "square", "triangle"]
        for label in labels:  # every thumbnail of each first page has its pixels
            _wait_thumbnails(page, label, PER_PAGE)
            cells = _cells(page, label)
            assert all(c["width"] == 32 for c in cells), cells
            assert all(c["fits"] for c in cells), cells  # 19 digits fit their cell
            assert all(c["shown"] == c["seed"] for c in cells)
        # The page holds the listing's seeds digit for digit.
        assert [c["seed"] for c in _cells(page, "circle")] == [i["seed_str"] for i in first]
        assert _range(page, "circle") == f"1–{PER_PAGE} of {N_FILL}"
        assert _range(page, "square") == f"1–{PER_PAGE} of {N_FILL + N_JUDGED - 10}"
        counts = page.text_content('section[data-label="square"] .counts')
        assert counts is not None and f"accepted {N_FILL + N_JUDGED - 10}" in counts
        assert "judge 10" in counts
        # A recipe without a judge: no image says "not judged" (the summary says it once);
        # the squares scored here show their scores.
        assert "not judged" not in str(page.text_content("#labels"))
        assert "no judge: every image is accepted" in str(page.text_content("#summary"))
        squares = page.eval_on_selector_all('section[data-label="square"] .score',
                                            "s => s.map(x => x.textContent)")
        assert squares and all(s.startswith("score ") for s in squares), squares
        assert not page.is_visible("#error")

        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "pool-page.png"
        page.screenshot(path=str(shot), full_page=True)
        thumbnails = page.eval_on_selector_all(".cell img[data-loaded='1']", "s => s.length")

        # The judge's rejects are listed apart; an empty tab says so.
        page.click('section[data-label="square"] [data-tab="rejected"]')
        _wait_thumbnails(page, "square", 10)
        assert all(c["width"] == 32 for c in _cells(page, "square"))
        page.click('section[data-label="triangle"] [data-tab="rejected"]')
        page.wait_for_function(
            """() => document.querySelector('section[data-label="triangle"] .empty')
                 ?.textContent === 'no rejected images'""", timeout=10_000)

        # Page through the circles: next, then the last page.
        page.click('section[data-label="circle"] [data-go="next"]')
        page.wait_for_function(
            f"""() => document.querySelector('section[data-label="circle"] .range')
                 .textContent.startsWith('{PER_PAGE + 1}–{2 * PER_PAGE}')""", timeout=10_000)
        _wait_thumbnails(page, "circle", PER_PAGE)
        page.click('section[data-label="circle"] [data-go="last"]')
        last = N_FILL - (N_FILL - 1) // PER_PAGE * PER_PAGE
        page.wait_for_function(
            f"""() => document.querySelector('section[data-label="circle"] .range')
                 .textContent === '{N_FILL - last + 1}–{N_FILL} of {N_FILL}'""",
            timeout=10_000)
        _wait_thumbnails(page, "circle", last)
        seeds = [c["seed"] for c in _cells(page, "circle")]
        assert seeds == [i["seed_str"] for i in _listed(live.url, headers, label="circle",
                                                        offset=N_FILL - last)]

        # A click rejects an image: its 63-bit seed reaches the verdicts route intact.
        victim = max(seeds, key=int)
        assert int(victim) > JS_EXACT
        page.click(f'section[data-label="circle"] .cell[data-seed="{victim}"] button.reject')
        page.wait_for_function(
            """() => document.querySelector('section[data-label="circle"] .n-person')
                 .textContent === '1'""", timeout=10_000)
        listed = _listed(live.url, headers, label="circle", rejected="true")
        assert [(i["seed_str"], i["rejected_by"]) for i in listed] == [(victim, "person")]
        # The fill target stands, so the planner makes a replacement for it.
        circle = _circle_counts(live.url, headers, accepted=N_FILL)
        assert circle["rejected_by_person"] == 1
        sampled = _sampled(live.url, headers)
        assert int(victim) not in sampled and len(sampled) == N_FILL

        # ... and the rejected tab restores it.
        page.click('section[data-label="circle"] [data-tab="rejected"]')
        _wait_thumbnails(page, "circle", 1)
        assert "rejected by person" in str(page.text_content(
            f'section[data-label="circle"] .cell[data-seed="{victim}"]'))
        page.click(f'section[data-label="circle"] .cell[data-seed="{victim}"] button.restore')
        page.wait_for_function(
            """() => document.querySelector('section[data-label="circle"] .n-person')
                 .textContent === '0'""", timeout=10_000)
        circle = _circle_counts(live.url, headers, accepted=N_FILL + 1)
        assert circle["rejected_by_person"] == 0
        assert int(victim) in _sampled(live.url, headers)
        assert not page.is_visible("#error")
    finally:
        page.close()

    # Only the first, keyless status poll may fail (401): no thumbnail answered 404.
    assert [e for e in console.errors if "401" not in e] == []

    # The screenshot: the whole page, not blank, showing the thumbnails it lists.
    assert thumbnails == 3 * PER_PAGE
    image = np.asarray(Image.open(io.BytesIO(shot.read_bytes())).convert("RGB"))
    assert image.shape[1] == 1280 and image.shape[0] >= 600
    assert image.std() > 20  # not blank
    # the thumbnails' pixels: many pixels of saturated colour (the squares' drawings)
    colourful = (image.max(axis=2).astype(int) - image.min(axis=2)) > 60
    assert colourful.mean() > 0.02
