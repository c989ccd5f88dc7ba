"""The judge in the real service: scores stored with each pool image, rejected images never
sampled, targets counting accepted images, and the low-acceptance stop."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from genaug.client import Client

#: Shots with a bright region in a different place per label (the tiny encoder is grey
#: pixels, so plain colours would all look alike): the tiny model's images score all over.
_REGIONS = {"circle": (slice(None), slice(0, 16)), "square": (slice(0, 16), slice(None)),
            "triangle": (slice(8, 24), slice(8, 24))}


def _shots(root: Path, labels: tuple[str, ...] = tuple(_REGIONS)) -> None:
    from PIL import Image

    for label in labels:
        (root / "shots" / label).mkdir(parents=True)
        for k in range(3):
            pixels = np.full((32, 32, 3), 40 + 20 * k, np.uint8)
            pixels[_REGIONS[label]] = 220 - 20 * k
            Image.fromarray(pixels).save(root / "shots" / label / f"{k}.png")


def _recipe(root: Path, text: str, judge: str) -> Path:
    path = root / "recipes.yaml"
    path.write_text(text.replace("    labels:", f"    judge: {judge}\n    labels:"))
    return path


def test_scores_are_stored_and_only_accepted_images_are_sampled_and_counted(
        make_service: Any, tmp_path: Path, shapes_recipe: str) -> None:
    _shots(tmp_path)
    recipes = _recipe(tmp_path, shapes_recipe, "{shots: shots, min_score: 0.4}")
    live = make_service(recipes=recipes, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=4, max_batch_images=4, data_root=tmp_path)
    detail = live.wait_recipe(lambda d: all(v >= 4 for v in d["fill"].values()), timeout=120)
    assert detail["judge"] == {"rule": "shots", "encoder": "tiny-digits-encoder",
                               "shots": "shots", "min_score": 0.4}
    assert detail["stopped"] == {}
    per_label = detail["per_label"]
    # Targets count accepted images: every label holds 4 accepted, and was generated past 4
    # stored images where the judge rejected some.
    for label, counts in per_label.items():
        assert counts["fill"] == counts["accepted"] == 4, (label, counts)
        assert counts["judged_total"] == counts["generated"] >= 4
        assert counts["accepted_total"] >= 4 and counts["rejected_by_person"] == 0
    assert sum(c["generated"] - c["accepted_total"] for c in per_label.values()) > 0, \
        "the judge rejected nothing: the test would not see a rejected image"
    store, planner = live.state.store, live.state.pools.planner
    pid, judge = planner.pool_ids["shapes"], planner.judges["shapes"]
    accepted: dict[str, set[int]] = {}
    rejected: dict[str, set[int]] = {}
    for label in per_label:
        for kept, into in ((True, accepted), (False, rejected)):
            page = store.curation.browse(pid, label, rejected=not kept, limit=100)
            into[label] = {image.seed for image in page.images}
            for image in page.images:
                # the stored score is the judge's score of the stored pixels
                pixels = store.curation.image(pid, label, image.seed)
                assert pixels is not None and image.score is not None
                again = float(judge.score(pixels[None], label)[0])
                assert abs(image.score - again) < 1e-5, (label, image.score, again)
                assert (image.score >= 0.4) == kept, (label, image)
    assert sum(len(s) for s in rejected.values()) > 0
    # Rejected images are never sampled: many samples, only accepted seeds come back.
    seen: set[tuple[str, int]] = set()
    with Client(live.url) as client:
        for _ in range(10):
            got = client.sample("shapes", n=12)
            names = [got.label_names[i] for i in got.labels.tolist()]
            seen |= set(zip(names, got.seeds.tolist(), strict=True))
    assert seen and all(seed in accepted[label] for label, seed in seen), seen
    assert not any(seed in rejected[label] for label, seed in seen)


def test_a_label_the_judge_rejects_is_stopped_and_says_why(
        make_service: Any, tmp_path: Path, shapes_recipe: str,
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from genaug.service.pool import acceptance

    assert (acceptance.STOP_AFTER, acceptance.STOP_ACCEPTANCE) == (50, 0.10)  # the docs' rule
    monkeypatch.setattr(acceptance, "STOP_AFTER", 16)  # the same rule, a third of the images
    # Two labels, and a min_score no image of the tiny model reaches: nothing is accepted.
    text = shapes_recipe.replace('      triangle: {prompts: ["a triangle"], '
                                 'negative_prompt: "blurry"}\n', "")
    _shots(tmp_path, ("circle", "square"))
    recipes = _recipe(tmp_path, text, "{shots: shots, min_score: 0.99}")
    with caplog.at_level(logging.WARNING, logger="genaug.service.pool.acceptance"):
        live = make_service(recipes=recipes, pool_path=tmp_path / "pool.db",
                            pool_capacity_per_label=100, max_batch_images=8,
                            data_root=tmp_path)
        detail = live.wait_recipe(lambda d: len(d["stopped"]) == 2, timeout=120)
        time.sleep(0.3)  # a batch in flight when the second label stopped is stored
        calls = len(live.worker.calls)
        time.sleep(0.5)
        assert len(live.worker.calls) == calls, "the planner kept spending on stopped labels"
    for label in ("circle", "square"):
        reason = detail["stopped"][label]
        counts = live.recipe()["per_label"][label]
        assert counts["accepted_total"] == 0 and 16 <= counts["judged_total"] < 32, counts
        # the count when it stopped (a batch already in flight is stored after it)
        judged = int(reason.removeprefix("stopped: the judge accepted 0 of the ").split()[0])
        assert 16 <= judged <= counts["judged_total"], (reason, counts)
        assert re.match(rf"stopped: the judge accepted 0 of the {judged} images of label "
                        rf"'{label}' it judged last, before \d{{4}}-\d\d-\d\d \d\d:\d\d UTC "
                        r"\(0 %, under 10 %\)", reason), reason
        for fix in ("more or better shots (judge.shots: shots/" + label + ")",
                    "train the label's adapter longer", "lower judge.min_score (now 0.99)"):
            assert fix in reason, reason
    # on the status page's data and in the recipe list too, and once in the log
    status = httpx.get(f"{live.url}/v1/status", timeout=30).json()
    assert status["recipes"][0]["stopped"] == detail["stopped"]
    listing = httpx.get(f"{live.url}/v1/recipes", timeout=30).json()["recipes"]
    assert listing[0]["stopped"] == detail["stopped"]
    lines = [r.getMessage() for r in caplog.records if "stopped: the judge" in r.getMessage()]
    assert len(lines) == 2 and {"'circle'", "'square'"} <= {w for line in lines
                                                           for w in line.split()}, lines
    # a fill budget gives a stopped label nothing
    r = httpx.post(f"{live.url}/v1/recipes/shapes/fill", json={"images": 8}, timeout=30)
    assert r.status_code == 409, r.text
    assert "circle, square stopped" in r.text and "'stopped', for the fix" in r.text, r.text


def test_a_clip_judge_from_a_model_folder_scores_the_pool(
        make_service: Any, tmp_path: Path, shapes_recipe: str, tiny_clip_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _shots(tmp_path)
    recipes = _recipe(tmp_path, shapes_recipe,
                      f"{{shots: shots, encoder: {tiny_clip_dir}, rule: prompts, "
                      "min_score: 0.0}")
    live = make_service(recipes=recipes, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=2, max_batch_images=4, data_root=tmp_path)
    detail = live.wait_recipe(lambda d: all(v >= 2 for v in d["fill"].values()), timeout=120)
    assert detail["judge"]["rule"] == "prompts" and detail["judge"]["encoder"] == str(
        tiny_clip_dir)
    store, planner = live.state.store, live.state.pools.planner
    pid, judge = planner.pool_ids["shapes"], planner.judges["shapes"]
    assert judge.encoder.device == live.state.model.device  # the generator's device
    for label, counts in detail["per_label"].items():
        assert counts["judged_total"] == counts["generated"] == 2, counts
        for image in store.curation.browse(pid, label, rejected=False, limit=10).images:
            pixels = store.curation.image(pid, label, image.seed)
            assert pixels is not None and image.score is not None
            assert 0.0 <= image.score <= 1.0
            assert abs(image.score - float(judge.score(pixels[None], label)[0])) < 1e-5
