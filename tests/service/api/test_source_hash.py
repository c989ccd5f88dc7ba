"""One image, one source hash: the same picture uploaded to ``/v1/variants`` and placed in a
recipe's image folder is named by the same hash in both answers' metadata, so a variant can
be traced to its source whichever way it was made."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

from genaug.service.recipes.sources import source_hash
from genaug.wire import decode_batch


def test_an_uploaded_image_and_the_same_image_in_a_recipe_folder_share_one_hash(
    make_service: Any, shapes_recipe: str, tmp_path: Path
) -> None:
    pixels = np.random.default_rng(3).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    folder = tmp_path / "real" / "circles"
    folder.mkdir(parents=True)
    Image.fromarray(pixels).save(folder / "0.png")
    recipes = tmp_path / "recipes.yaml"
    recipes.write_text(shapes_recipe.replace(
        'circle: {prompts: ["a circle", "a round circle"]}',
        'circle: {prompts: ["a circle"], images: circles, strength: 0.5}',
    ))
    live = make_service(recipes=recipes, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=1, data_root=tmp_path / "real")

    png = io.BytesIO()
    Image.fromarray(pixels).save(png, format="PNG")
    params = json.dumps({"prompt": "a circle", "strength": 0.5, "seed": 1})
    uploaded = httpx.post(live.url + "/v1/variants", timeout=120, files=[
        ("image", ("0.png", png.getvalue(), "image/png")),
        ("params", (None, params.encode(), "application/json")),
    ])
    assert uploaded.status_code == 200, uploaded.text
    (by_upload,) = decode_batch(uploaded.content).metadata["source_hashes"]

    deadline = time.monotonic() + 60
    while True:
        sampled = httpx.post(live.url + "/v1/recipes/shapes/sample", timeout=60,
                             json={"labels": ["circle"], "n": 1})
        assert sampled.status_code == 200, sampled.text
        if sampled.headers["X-Genaug-Count"] == "1":
            break
        assert time.monotonic() < deadline, "the pool never filled the circle label"
        time.sleep(0.1)
    (by_pool,) = decode_batch(sampled.content).metadata["source_hashes"]

    assert by_upload == by_pool == source_hash(pixels)
