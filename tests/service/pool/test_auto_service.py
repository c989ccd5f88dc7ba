"""``speed: auto`` in the real service: the embedded digits model, a judge fitted on real
digits, the shipped recipe's sampler (20 Euler steps, guidance 3) as the reference. The pool
probes, decides a cheaper sampler, says so in the recipe detail and on the status page, keeps
the decision across a restart, and every image's provenance remakes it bit for bit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from genaug.cli import main
from genaug.client import Client
from genaug.local_service import free_port
from genaug.service.sampling.rule import PROBE_IMAGES
from genaug.service.testing import LiveService, start_service

ROOT = Path(__file__).resolve().parents[3]
LABELS = ("0", "1", "2")


@pytest.fixture(scope="module")
def digits_model() -> Any:
    from genaug.service.pipeline.load import load_model

    return load_model(source="tiny-digits", unet_weights=None, device="cpu", dtype="auto")


def _recipes(root: Path) -> Path:
    """The shipped digits recipe, three of its labels, speed auto, a judge on real shots."""
    from genaug.digits import write_split_folders

    write_split_folders(root / "data", ["fewshot"], per_class=20, seed=0)
    spec = yaml.safe_load((ROOT / "recipes" / "digits.yaml").read_text())["recipes"][0]
    spec["labels"] = {label: spec["labels"][label] for label in LABELS}
    spec.update(speed="auto", judge={"shots": "fewshot"})
    path = root / "recipes.yaml"
    path.write_text(yaml.safe_dump({"recipes": [spec]}))
    return path


def _serve(model: Any, root: Path, recipes: Path) -> LiveService:
    return start_service(model, recipes=str(recipes),
                         pool_path=str(root / "pool.db"), data_root=str(root / "data"),
                         pool_capacity_per_label=2 * PROBE_IMAGES + 16, max_batch_images=16,
                         port=free_port())


@pytest.mark.slow  # an end-to-end run: about 70 s of probing on 2 cores
def test_auto_decides_a_cheaper_sampler_says_why_and_keeps_it(
        digits_model: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipes = _recipes(tmp_path)
    live = _serve(digits_model, tmp_path, recipes)
    try:
        detail = live.wait_recipe(lambda d: d["sampling"]["state"] == "decided", name="digits",
                                   timeout=300)
        sampling = detail["sampling"]
        assert sampling["speed"] == "auto"
        chosen = sampling["sampler"]
        # The reference costs 40 UNet rows per image (20 steps, guided).
        assert sampling["cheaper"] >= 4.0, sampling
        assert "within 0.05" in sampling["reason"] and chosen["name"] in sampling["reason"]
        assert sampling["candidates"][-1]["name"] == "default 20 steps, guidance 3"
        status = httpx.get(live.url + "/v1/status", timeout=30).json()
        (summary,) = status["recipes"]
        assert summary["sampling"]["sampler"] == chosen
        # New images are drawn with the decision.
        with Client(live.url) as client:
            client.fill("digits", per_label=2 * PROBE_IMAGES + 16)
        live.wait_recipe(lambda d: all(v >= 2 * PROBE_IMAGES + 16 for v in d["fill"].values()),
                         name="digits", timeout=300)
    finally:
        live.stop()

    # Every image says which sampler drew it; the probes and the decision's.
    monkeypatch.setenv("GENAUG_RECIPES", str(recipes))
    monkeypatch.setenv("GENAUG_MODEL", "tiny-digits")
    out = tmp_path / "export"
    assert main(["export", "--recipe", "digits", "--out", str(out), "--pool-path",
                 str(tmp_path / "pool.db")]) == 0
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    drawn = {row["sampler"] for row in rows}
    assert "default 20 steps, guidance 3" in drawn and chosen["name"] in drawn
    assert all(row["speed"] == "quality" and "speed" not in row["not_recorded"]
               for row in rows)

    # A restart keeps the decision (the pool's, not the process's), before any new image.
    again = _serve(digits_model, tmp_path, recipes)
    try:
        told = again.recipe("digits")["sampling"]
        assert told["state"] == "decided" and told["sampler"] == chosen
        # The manifest remakes an image of the decided sampler bit for bit.
        row = next(r for r in rows if r["sampler"] == chosen["name"])
        with Client(again.url) as client:
            remade = client.generate(
                row["prompt"], seed=int(row["seed_str"]), height=row["height"],
                width=row["width"], steps=row["steps"], guidance=row["guidance"],
                scheduler=row["scheduler"], speed=row["speed"]).images[0]
        from PIL import Image

        assert np.array_equal(remade, np.asarray(Image.open(out / row["file"]).convert("RGB")))
    finally:
        again.stop()
