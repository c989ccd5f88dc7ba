"""The pool page (``GET /pool/{name}``) in a real browser: headless Debian Chromium via
Playwright, on a live tiny service with API keys.

The pool is seeded through the service's own store (500 images of one label, judge scores,
some images the judge rejected), as the planner stores them; nothing is generated. The test
goes from the status page to the pool page by its link (the key entered once), pages through
the label of 500, rejects an image with a click and checks through the API that it is
rejected and never sampled, then restores it. A screenshot lands in
``artifacts/pool-page.png`` (git-ignored) and is checked: its size, that it is not blank, and
that it shows the thumbnails the page lists.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image
from test_status_page import ARTIFACTS, KEY, Console, browser  # noqa: F401 (fixture)

from genaug.wire import decode_batch

PER_PAGE = 24
N_CIRCLE = 500
N_SQUARE = 30  # 10 of them below the judge's bar


def _shapes(n: int, kind: str, seed: int) -> np.ndarray:
    """n distinct 32x32 RGB drawings: a disc or a square of varying size and colour."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:32, :32]
    out = np.full((n, 32, 32, 3), 235, np.uint8)
    for k in range(n):
        r = 5 + k % 9
        colour = rng.integers(30, 200, 3)
        mask = ((yy - 16) ** 2 + (xx - 16) ** 2 <= r * r) if kind == "circle" else (
            (abs(yy - 16) <= r) & (abs(xx - 16) <= r))
        out[k][mask] = colour
    return out


def _seed_pool(live: Any) -> str:
    pools = live.state.pools
    pid: str = pools.pool_ids["shapes"]
    scores = np.linspace(0.5, 1.0, N_CIRCLE)
    pools.store.add(pid, "circle", _shapes(N_CIRCLE, "circle", 1), range(1000, 1000 + N_CIRCLE),
                    model_hash="m", scores=scores, keep=[True] * N_CIRCLE)
    square_scores = np.linspace(0.0, 1.0, N_SQUARE)
    pools.store.add(pid, "square", _shapes(N_SQUARE, "square", 2), range(5000, 5000 + N_SQUARE),
                    model_hash="m", scores=square_scores, keep=np.arange(N_SQUARE) >= 10,
                    next_index=N_SQUARE)
    return pid


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
    _seed_pool(live)
    headers = {"Authorization": f"Bearer {KEY}"}
    assert httpx.post(live.url + "/v1/recipes/shapes/verdicts",  # keys protect verdicts
                      json={"label": "circle", "seeds": [1000], "keep": False}).status_code == 401

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
        assert labels == ["circle", "square", "triangle"]  # every label, the empty one too
        _wait_thumbnails(page, "circle", PER_PAGE)
        _wait_thumbnails(page, "square", N_SQUARE - 10)
        assert _range(page, "circle") == f"1–{PER_PAGE} of {N_CIRCLE}"
        assert _range(page, "square") == "1–20 of 20"
        assert "no accepted images yet" in str(page.text_content('section[data-label="triangle"]'))
        counts = page.text_content('section[data-label="square"] .counts')
        assert counts is not None and "accepted 20" in counts and "judge 10" in counts

        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "pool-page.png"
        page.screenshot(path=str(shot), full_page=True)
        thumbnails = page.eval_on_selector_all(".cell img[data-loaded='1']", "s => s.length")

        # Page through the label of 500: next, then the last page.
        page.click('section[data-label="circle"] [data-go="next"]')
        page.wait_for_function(
            """() => document.querySelector('section[data-label="circle"] .range')
                 .textContent.startsWith('25–48')""", timeout=10_000)
        _wait_thumbnails(page, "circle", PER_PAGE)
        page.click('section[data-label="circle"] [data-go="last"]')
        last = N_CIRCLE - (N_CIRCLE - 1) // PER_PAGE * PER_PAGE
        page.wait_for_function(
            f"""() => document.querySelector('section[data-label="circle"] .range')
                 .textContent === '{N_CIRCLE - last + 1}–{N_CIRCLE} of {N_CIRCLE}'""",
            timeout=10_000)
        _wait_thumbnails(page, "circle", last)
        seeds = page.eval_on_selector_all('section[data-label="circle"] .cell',
                                          "s => s.map(x => Number(x.dataset.seed))")
        assert seeds == list(range(1000 + N_CIRCLE - last, 1000 + N_CIRCLE))  # by score

        # A click rejects an image.
        victim = seeds[0]
        page.click(f'section[data-label="circle"] .cell[data-seed="{victim}"] button.reject')
        page.wait_for_function(
            """() => document.querySelector('section[data-label="circle"] .n-person')
                 .textContent === '1'""", timeout=10_000)
        listed = httpx.get(live.url + "/v1/recipes/shapes/images", headers=headers,
                           params={"label": "circle", "rejected": "true"}).json()
        assert [(i["seed"], i["rejected_by"]) for i in listed["images"]] == [(victim, "person")]
        detail = httpx.get(live.url + "/v1/recipes/shapes", headers=headers).json()
        assert detail["per_label"]["circle"]["rejected_by_person"] == 1
        assert detail["per_label"]["circle"]["accepted"] == N_CIRCLE - 1
        sampled = _sampled(live.url, headers)
        assert victim not in sampled and len(sampled) == N_CIRCLE - 1

        # ... and the rejected tab restores it.
        page.click('section[data-label="circle"] [data-tab="rejected"]')
        _wait_thumbnails(page, "circle", 1)
        assert "rejected by person" in str(page.text_content(
            f'section[data-label="circle"] .cell[data-seed="{victim}"]'))
        page.click(f'section[data-label="circle"] .cell[data-seed="{victim}"] button.restore')
        page.wait_for_function(
            """() => document.querySelector('section[data-label="circle"] .n-person')
                 .textContent === '0'""", timeout=10_000)
        assert victim in _sampled(live.url, headers)
    finally:
        page.close()

    # Only the first, keyless status poll may fail (401).
    assert [e for e in console.errors if "401" not in e] == []

    # The screenshot: the whole page, not blank, showing the thumbnails it lists.
    assert thumbnails == 2 * PER_PAGE - 4  # 24 circles + 20 accepted squares
    image = np.asarray(Image.open(io.BytesIO(shot.read_bytes())).convert("RGB"))
    assert image.shape[1] == 1280 and image.shape[0] >= 600
    assert image.std() > 20  # not blank
    # the thumbnails' drawings: many pixels of the discs' and squares' saturated colours
    colourful = (image.max(axis=2).astype(int) - image.min(axis=2)) > 60
    assert colourful.mean() > 0.02
