"""``speed: auto`` where users meet it: a first fill, and a restart while a full pool probes.

The real service with the embedded digits model, the shipped digits recipe (three of its
labels, its prompts, 20 guided Euler steps) and a judge fitted on real digits, as
docs/turbo.md sets it up:

- a first fill of an ``auto`` recipe costs what the same fill costs without ``auto``: the
  probes are the images it asks for, none is made past its target only to decide, and the
  job says that auto is still deciding;
- a pre-generating service restarted while its full pool is still probing goes on probing
  (nothing is planned for a full label, yet the probes it lacks are drawn).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from genaug.client import Client
from genaug.service.testing import LiveService, start_service

ROOT = Path(__file__).resolve().parents[3]
LABELS = ("0", "1", "2")


@pytest.fixture(scope="module")
def digits_model() -> Any:
    from genaug.service.pipeline.load import load_model

    return load_model(source="tiny-digits", unet_weights=None, device="cpu", dtype="auto")


def _recipes(root: Path) -> Path:
    """The shipped digits recipe, three of its labels, speed auto, a judge on 10 real shots
    per label."""
    from genaug.digits import write_split_folders

    write_split_folders(root / "data", ["fewshot"], per_class=10, seed=0)
    spec = yaml.safe_load((ROOT / "recipes" / "digits.yaml").read_text())["recipes"][0]
    spec["labels"] = {label: spec["labels"][label] for label in LABELS}
    spec.update(speed="auto", judge={"shots": "fewshot"})
    path = root / "recipes.yaml"
    path.write_text(yaml.safe_dump({"recipes": [spec]}))
    return path


def _serve(model: Any, root: Path, **settings: Any) -> LiveService:
    return start_service(model, recipes=str(_recipes(root)), pool_path=str(root / "pool.db"),
                         data_root=str(root / "data"), max_batch_images=8, **settings)


def test_a_first_auto_fill_makes_only_what_it_asked(digits_model: Any, tmp_path: Path) -> None:
    live = _serve(digits_model, tmp_path, pregenerate=False, pool_capacity_per_label=64)
    try:
        with Client(live.url) as client:
            job = client.fill("digits", per_label=12)
            ended = job.wait(timeout=300)
        assert ended["state"] == "done", ended
        assert ended["sampling"].startswith("auto is still deciding: probing the recipe's "
                                            "own sampler"), ended["sampling"]
        # Nothing is drawn after the fill only to decide: what the pool generated is what
        # the job made, once the last batch is in (before, the probes' rounds of 64 began
        # at once).
        live.wait_recipe(lambda d: sum(p["reserved"] for p in d["per_label"].values()) == 0,
                         name="digits")
        time.sleep(2.0)  # the planner is asked again within milliseconds of a batch's end
        detail = live.recipe("digits")
        for label in LABELS:
            assert detail["per_label"][label]["generated"] == ended["labels"][label]["made"], (
                label, detail["per_label"][label], ended["labels"][label])
        assert detail["sampling"]["state"] == "probing"
    finally:
        live.stop()


def test_a_full_pool_that_was_probing_goes_on_probing_after_a_restart(
        digits_model: Any, tmp_path: Path) -> None:
    capacity = 8
    live = _serve(digits_model, tmp_path, pool_capacity_per_label=capacity)
    try:
        live.wait_recipe(lambda d: all(v >= capacity for v in d["fill"].values()),
                         name="digits", timeout=300)
    finally:
        live.stop()
    again = _serve(digits_model, tmp_path, pool_capacity_per_label=capacity)
    try:
        before = again.recipe("digits")
        assert before["sampling"]["state"] == "probing"
        assert all(v >= capacity for v in before["fill"].values())
        made = {label: p["generated"] for label, p in before["per_label"].items()}
        # Every label is full, so only the probes it lacks are drawn: the pool moves on.
        after = again.wait_recipe(
            lambda d: all(d["per_label"][label]["generated"] > made[label] for label in LABELS),
            name="digits", timeout=120)
        assert after["sampling"]["state"] == "probing"
        assert after["sampling"]["since"] is not None
    finally:
        again.stop()
