"""``genaug export``'s manifest: one row per PNG with what made it, enough to remake it.

The pool is made as in the product: the real service and planner fill a judged recipe with
the tiny pipeline (63-bit seeds as the planner draws them), one label of img2img variants of
real images; a person rejects one image and restores one the judge rejected. A pool written
by schema 3 exports rows that say what they did not record.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from genaug.cli import main
from genaug.client import Client
from genaug.service.commands.export import PRE_V4, PRE_V6, configured_model
from genaug.service.pool.open import open_pool
from genaug.service.pool.types import Provenance
from genaug.service.recipes.load import load_recipes
from genaug.service.recipes.sources import source_hash
from genaug.service.settings import Settings

CAPACITY = 3
V3 = Path(__file__).parents[1] / "pool" / "data" / "pool_v3.db"
RECIPES = Path(__file__).parents[3] / "recipes"


@pytest.fixture(scope="module")
def data_root(service: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``shots/<label>`` for the judge (circles and variants of the real images as the tiny
    model draws them, the circles' negatives as squares, which it never draws) and ``tri/``
    (two real images the triangle label makes variants of)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("export-root")
    real = np.zeros((2, 32, 32, 3), np.uint8)
    real[0, 8:24, 8:24], real[1, 8:24, 8:24] = (200, 30, 30), (30, 30, 200)
    with Client(service.url) as client:  # other seeds than the pool's
        drawn = client.generate("a circle", n=8, height=32, width=32, steps=2, guidance=3.0,
                                seed=1000).images
        varied = client.variants(real, "a triangle", strength=0.5, n_per_image=4, steps=2,
                                 guidance=3.0, seed=2000).images
    for label, images in (("shots/circle", drawn), ("shots/square", 255 - drawn),
                          ("shots/triangle", varied), ("tri", real)):
        (root / label).mkdir(parents=True)
        for i, pixels in enumerate(images):
            Image.fromarray(pixels).save(root / label / f"{i}.png")
    return root


def _recipes(folder: Path, shapes_recipe: str) -> Path:
    text = shapes_recipe.replace(
        'triangle: {prompts: ["a triangle"], negative_prompt: "blurry"}',
        'triangle: {prompts: ["a triangle"], images: tri, strength: 0.5, '
        "variants_per_image: 2}")
    text = text.replace("    labels:", "    judge: {shots: shots, min_score: 0.9}\n    labels:")
    path = folder / "recipes.yaml"
    path.write_text(text)
    return path


def _export(out: Path, *extra: str, recipe: str = "shapes") -> None:
    assert main(["export", "--recipe", recipe, "--out", str(out), *extra]) == 0


def _settled(live: Any) -> None:
    """Wait until the planner has refilled what a person's reject took (the fill's target
    stays), so what the pool holds no longer changes under the export."""
    deadline = time.monotonic() + 60
    while True:
        detail = httpx.get(f"{live.url}/v1/recipes/shapes", timeout=30).json()
        labels = detail["per_label"]
        if all(v["reserved"] == 0 and (v["fill"] >= CAPACITY or k in detail["stopped"])
               for k, v in labels.items()):
            return
        assert time.monotonic() < deadline, detail
        time.sleep(0.2)


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


@pytest.fixture
def judged_pool(make_service: Any, tmp_path: Path, shapes_recipe: str, data_root: Path,
                monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A live service whose planner filled the judged recipe: every label full or stopped."""
    recipes = _recipes(tmp_path, shapes_recipe)
    live = make_service(recipes=recipes, pool_path=tmp_path / "pool.db", data_root=data_root,
                        pregenerate=False, pool_capacity_per_label=64, max_batch_images=8)
    with Client(live.url) as client:
        client.fill("shapes", per_label=CAPACITY)
    deadline = time.monotonic() + 90
    while True:
        detail = httpx.get(f"{live.url}/v1/recipes/shapes", timeout=30).json()
        done = {k for k, v in detail["fill"].items() if v >= CAPACITY} | set(detail["stopped"])
        if done == {"circle", "square", "triangle"}:
            break
        assert time.monotonic() < deadline, detail
        time.sleep(0.2)
    for key, value in {"GENAUG_POOL_PATH": tmp_path / "pool.db", "GENAUG_RECIPES": recipes,
                       "GENAUG_DATA_ROOT": data_root, "GENAUG_MODEL": "tiny-random"}.items():
        monkeypatch.setenv(key, str(value))
    yield live


def test_every_exported_png_has_a_manifest_row_with_what_made_it(
        judged_pool: Any, tmp_path: Path) -> None:
    from PIL import Image

    live = judged_pool
    store, pid = live.state.store, live.state.pools.pool_ids["shapes"]
    recipe = load_recipes(tmp_path / "recipes.yaml")["shapes"]
    weights = live.state.model.weights_hash
    stored = list(store.reads.iter_records(pid, include_rejected=True))
    judged_out = next(r for r in stored if not r.judge_keep)  # squares: the judge says no
    person_out = next(r for r in stored if r.accepted and r.label == "circle")
    with Client(live.url) as client:
        client.verdict("shapes", judged_out.label, [judged_out.seed], keep=True)
        client.verdict("shapes", "circle", [person_out.seed], keep=False)
    _settled(live)
    out = tmp_path / "export"
    _export(out)
    rows = _rows(out)
    pngs = sorted(p.relative_to(out).as_posix() for p in out.glob("*/*.png"))
    accepted = list(store.reads.iter_records(pid))
    assert sorted(r["file"] for r in rows) == pngs and len(rows) == len(accepted) > CAPACITY
    assert [(r["label"], r["seed"]) for r in rows] == [(a.label, a.seed) for a in accepted]
    assert f"circle/{person_out.seed}.png" not in pngs  # a person's reject is not exported
    assert any(r["seed"] >= 2**53 for r in rows)  # seeds as drawn: beyond JavaScript's ints
    fields = {"file", "recipe", "recipe_hash", "label", "seed", "seed_str", "plan_index",
              "prompt", "negative_prompt", "pool_id", "model", "model_hash", "adapter",
              "adapter_hash", "adapter_scale", "width", "height", "channels", "steps",
              "guidance", "scheduler", "strength", "source", "score", "judge_keep", "judge",
              "judge_key", "verdict", "verdict_at", "accepted", "created", "not_recorded",
              "speed", "sampler"}
    sources = {source_hash(np.asarray(Image.open(p).convert("RGB")))
               for p in sorted((live.settings.data_root / "tri").glob("*.png"))}
    for row in rows:
        assert set(row) == fields, set(row) ^ fields
        label, seed = row["label"], row["seed"]
        assert isinstance(seed, int) and row["seed_str"] == str(seed)
        assert row["file"] == f"{label}/{seed}.png" and (out / row["file"]).is_file()
        planned = recipe.plan(label, row["plan_index"])
        assert (planned.seed, planned.prompt, planned.negative_prompt) == (
            seed, row["prompt"], row["negative_prompt"])
        assert (row["recipe"], row["recipe_hash"], row["pool_id"]) == (
            "shapes", recipe.spec_hash(), pid)
        assert row["model"] == "tiny-random" and row["model_hash"].startswith(weights)
        assert (row["steps"], row["guidance"], row["scheduler"]) == (2, 3.0, "default")
        assert (row["speed"], row["sampler"]) == ("quality", "default 2 steps, guidance 3")
        assert (row["width"], row["height"], row["channels"]) == (32, 32, 3)
        assert (row["adapter"], row["adapter_hash"], row["adapter_scale"]) == (None,) * 3
        if label == "triangle":  # img2img variants: their strength and source
            assert row["strength"] == 0.5 and row["source"] in sources
        else:
            assert row["strength"] is None and row["source"] is None
        assert isinstance(row["score"], float) and 0.0 <= row["score"] <= 1.0
        judge = row["judge"]
        assert (judge["min_score"], judge["rule"], judge["shots"]) == (0.9, "shots", "shots")
        assert len(row["judge_key"]) == 16 and len(judge["shots_hash"]) == 16
        assert row["accepted"] is True and row["not_recorded"] == []
        assert datetime.fromisoformat(row["created"]).utcoffset() is not None
    restored = next(r for r in rows if r["seed"] == judged_out.seed)
    assert (restored["verdict"], restored["judge_keep"]) == ("keep", False)
    assert restored["score"] < 0.9 and restored["verdict_at"] is not None
    assert {r["verdict"] for r in rows if r["seed"] != judged_out.seed} == {None}
    header = json.loads((out / "manifest.json").read_text())
    assert (header["pool_id"], header["recipe_hash"], header["images"]) == (
        pid, recipe.spec_hash(), len(rows))
    assert header["recipe_spec"] == recipe.spec() and header["genaug"]
    assert header["models"] == [{"model": "tiny-random", "model_hash": rows[0]["model_hash"]}]
    # Again, after a person rejected one more: rewritten whole, its PNG gone, no duplicates.
    gone = rows[0]
    with Client(live.url) as client:
        client.verdict("shapes", gone["label"], [gone["seed"]], keep=False)
    _export(out)
    again = _rows(out)
    kept = [r for r in again if r["seed"] in {r["seed"] for r in rows}]
    assert kept == [r for r in rows if r["seed"] != gone["seed"]]  # the planner may add more
    assert len({r["seed"] for r in again}) == len(again)
    assert not (out / gone["file"]).exists()
    assert sorted(p.relative_to(out).as_posix() for p in out.glob("*/*.png")) == sorted(
        r["file"] for r in again)


def test_a_manifest_row_remakes_its_image(judged_pool: Any, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A text-to-image row's prompt, seed, size, steps, guidance and scheduler give the same
    pixels through the same model: bit-identical on the CPU (an image depends on its own
    request and seed, never on its batch mates). Exported as the README writes the command,
    with no recipe file: the pool holds its recipe's spec, so every row has its prompt."""
    from PIL import Image

    monkeypatch.delenv("GENAUG_RECIPES")
    out = tmp_path / "export"
    _export(out)
    assert all(r["prompt"] and r["recipe_hash"] for r in _rows(out))
    row = next(r for r in _rows(out) if r["strength"] is None)  # text-to-image
    with Client(judged_pool.url) as client:
        remade = client.generate(
            row["prompt"], negative_prompt=row["negative_prompt"], seed=int(row["seed_str"]),
            height=row["height"], width=row["width"], steps=row["steps"],
            guidance=row["guidance"], scheduler=row["scheduler"],
            speed=row["speed"]).images[0]
    exported = np.asarray(Image.open(out / row["file"]).convert("RGB"))
    assert np.array_equal(remade, exported)


def test_a_pool_stored_before_schema_4_says_what_it_did_not_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "v3.db"
    shutil.copy(V3, db)  # written by the schema-3 PoolStore; upgraded in place on open
    with open_pool(db, capacity_per_label=100) as store:
        store.add("digits-0123456789ab", "1", np.zeros((1, 8, 8, 1), np.uint8), [3102],
                  model_hash="m", next_index=3, provenance=Provenance(steps=2, guidance=3.0))
    monkeypatch.delenv("GENAUG_RECIPES", raising=False)
    monkeypatch.setenv("GENAUG_MODEL", "tiny-random")
    out = tmp_path / "out"
    # No recipe stored with it and none given: refused in one line naming the fix, never a
    # manifest whose prompts are silently null.
    capsys.readouterr()
    argv = ["export", "--recipe", "digits", "--out", str(out), "--pool-path", str(db)]
    assert main(argv) == 2
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and "pass --recipes FILE" in said, said
    assert "no recipe file was given" in said and not (out / "manifest.jsonl").exists()
    # Served once by this genaug: its planner records the recipe, and the export has it.
    recipe = load_recipes(RECIPES / "digits.yaml")["digits"]
    with open_pool(db, capacity_per_label=100) as store:
        store.recipe_specs.record("digits-0123456789ab", recipe)
    _export(out, "--pool-path", str(db), recipe="digits")
    rows = _rows(out)
    assert [(r["label"], r["seed"]) for r in rows] == [("0", 3000), ("1", 3100), ("1", 3101),
                                                      ("1", 3102)]
    # Label 1's images were added with no plan index: their prompt is not known either.
    unknown = ["model"]  # model hash "m" is no model's
    for row in rows[:3]:
        planned = row["plan_index"] is not None
        assert row["not_recorded"] == [*PRE_V4, *PRE_V6, *([] if planned else ["prompt"]),
                                       *unknown]
        assert (row["steps"], row["guidance"], row["judge"]) == (None, None, None)
    assert rows[0]["prompt"] == recipe.plan("0", 0).prompt and rows[0]["recipe_hash"]
    assert rows[3]["not_recorded"] == [*PRE_V6, "prompt", *unknown]
    assert (rows[3]["steps"], rows[3]["guidance"], rows[3]["channels"]) == (2, 3.0, 1)
    assert rows[0]["score"] == pytest.approx(0.95)


def test_the_model_hash_the_export_reads_is_load_models(tmp_path: Path) -> None:
    """A folder model is hashed without loading it: the same hash ``load_model`` gives."""
    from genaug.service.pipeline.load import load_model
    from genaug.service.pipeline.tiny import build_tiny_pipeline

    folder = tmp_path / "model"
    build_tiny_pipeline(batch_invariant=False).save_pretrained(str(folder))
    loaded = load_model(source=folder, unet_weights=None, device="cpu", dtype="float32")
    assert configured_model(Settings(model=str(folder))) == (str(folder),
                                                               loaded.weights_hash)
    assert configured_model(Settings(model=str(tmp_path / "none"))) is None
