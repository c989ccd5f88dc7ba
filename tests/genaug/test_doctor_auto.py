"""``genaug doctor --recipe NAME`` on a ``speed: auto`` recipe: the ``sampling`` check.

While auto probes, the doctor warns, naming for how long and why, with what draws the probes
it lacks; once decided it says ok, with the sampler and how much cheaper it is. Against a
real service serving the digits recipe with a judge and ``speed: auto`` (as
tests/service/pool/test_auto_fills.py serves it): a fresh auto pool is a probing one, so the
test needs no decision. The decided branch, and the minutes, are checked on recorded details.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_doctor import doctor, line

import genaug.doctor
from genaug.service.testing import LiveService, start_service

ROOT = Path(__file__).resolve().parents[2]
LABELS = ("0", "1", "2")


@pytest.fixture(scope="module")
def auto_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveService]:
    """The embedded digits model serving the shipped digits recipe (three labels) with
    ``speed: auto`` and a judge on 10 real shots per label, without pre-generation; one image
    per label filled, so auto has begun probing."""
    from genaug.client import Client
    from genaug.digits import write_split_folders
    from genaug.service.pipeline.load import load_model

    root = tmp_path_factory.mktemp("doctor-auto")
    write_split_folders(root / "data", ["fewshot"], per_class=10, seed=0)
    spec = yaml.safe_load((ROOT / "recipes" / "digits.yaml").read_text())["recipes"][0]
    spec["labels"] = {label: spec["labels"][label] for label in LABELS}
    spec.update(speed="auto", judge={"shots": "fewshot"})
    (root / "recipes.yaml").write_text(yaml.safe_dump({"recipes": [spec]}))
    model = load_model(source="tiny-digits", unet_weights=None, device="cpu", dtype="auto")
    live = start_service(model, recipes=str(root / "recipes.yaml"),
                         pool_path=str(root / "pool.db"), data_root=str(root / "data"),
                         max_batch_images=8, pregenerate=False, pool_capacity_per_label=256)
    try:
        with Client(live.url) as client:
            client.fill("digits", per_label=1).wait(timeout=120)
        yield live
    finally:
        live.stop()


def test_a_probing_auto_pool_is_a_warning_naming_how_long_why_and_the_fix(
        auto_service: LiveService) -> None:
    sampling = auto_service.recipe("digits")["sampling"]
    assert sampling["state"] == "probing" and sampling["since"] is not None, sampling
    code, text, _ = doctor("--url", auto_service.url, "--recipe", "digits")
    assert code == 0, text  # a warning: the pool works, at the recipe's own cost
    found, fix = line(text, "sampling").split("\n")
    assert found.startswith("warn  sampling  'digits' (speed auto) has been probing for under "
                            "a minute: probing the recipe's own sampler (new pool); no cheaper "
                            "sampler draws the pool until auto decides"), found
    fill = max(auto_service.recipe("digits")["fill"].values())
    assert fix.strip() == (
        f"fix: probing ends as the pool fills: a fill of {fill + 128} per label (genaug "
        f"pregenerate --recipe digits --per-label {fill + 128} --url {auto_service.url}), or "
        "GENAUG_PREGENERATE=true, draws the probes it lacks")
    order = [ln[6:14].strip() for ln in text.splitlines()[:-1] if not ln.startswith(" ")]
    assert order[order.index("pool") + 1] == "sampling"


def test_a_recipe_that_is_not_auto_has_no_sampling_check() -> None:
    fixed = {"name": "shapes", "sampling": {"speed": "quality", "state": "fixed",
                                            "reason": "the recipe's speed quality"}}
    assert genaug.doctor.check_sampling(fixed, pregenerate=True, url="http://h:1") is None
    assert genaug.doctor.check_sampling({"name": "old"}, pregenerate=True, url="http://h:1") is None


#: A decided auto recipe's detail, as ``GET /v1/recipes/digits`` answered it.
DECIDED: dict[str, Any] = {
    "name": "digits", "capacity_per_label": 256, "fill": {"0": 256, "1": 256},
    "sampling": {
        "speed": "auto", "state": "decided",
        "sampler": {"speed": "auto", "scheduler": "unipc", "steps": 2, "guidance": 3.0,
                    "name": "unipc 2 steps, guidance 3"},
        "reason": "unipc 2 steps, guidance 3: every label's judge acceptance within 0.05 of "
                  "the recipe's own sampler (euler 20 steps, guidance 3; one-sided 95 %), "
                  "diversity at least 0.94 of it; 10.0x fewer UNet rows per image",
        "cheaper": 10.0, "candidates": [], "since": 1_800_000_000.0,
    },
}


def test_a_decided_auto_pool_is_ok_with_the_sampler_and_how_much_cheaper() -> None:
    check = genaug.doctor.check_sampling(DECIDED, pregenerate=True, url="http://h:1",
                           now=1_800_000_000.0 + 12 * 60)
    assert check is not None and check.status == "ok" and check.fix == ""
    assert check.message == (
        "'digits' (speed auto) decided 12 min ago: drawn with unipc 2 steps, guidance 3, 10x "
        "cheaper than the recipe's own sampler (every label's judge acceptance within 0.05 of "
        "the recipe's own sampler (euler 20 steps, guidance 3; one-sided 95 %), diversity at "
        "least 0.94 of it; 10.0x fewer UNet rows per image)")


def _probing(reason: str, fill: dict[str, int], minutes: float) -> dict[str, Any]:
    return {"name": "digits", "capacity_per_label": 32, "fill": fill,
            "sampling": {"speed": "auto", "state": "probing", "sampler": None,
                         "reason": reason, "cheaper": None, "candidates": [],
                         "since": time.time() - minutes * 60}}


def test_probing_for_minutes_says_how_many() -> None:
    detail = _probing("probing unipc 2 steps, guidance 3: label 3 needs more images to tell",
                      {"0": 10, "3": 12}, 17.2)
    check = genaug.doctor.check_sampling(detail, pregenerate=True, url="http://h:1")
    assert check is not None and check.status == "warn"
    assert check.message.startswith("'digits' (speed auto) has been probing for 17 min: "
                                    "probing unipc 2 steps, guidance 3: label 3 needs more")
    assert check.fix == (
        "probing ends as the pool fills: the idle generator draws the probes it lacks "
        "(pre-generation is on); a fill draws them first: genaug pregenerate --recipe digits "
        "--per-label 32 --url http://h:1")


def test_a_full_label_without_pregeneration_needs_the_generator() -> None:
    detail = _probing("probing the recipe's own sampler (new pool)", {"0": 32, "1": 5}, 20)
    check = genaug.doctor.check_sampling(detail, pregenerate=False, url="http://h:1")
    assert check is not None and check.status == "warn"
    assert check.fix.startswith("label(s) 0 are at the pool's capacity 32, so no fill draws "
                                "the probes they lack: serve with GENAUG_PREGENERATE=true")


def test_every_label_stopped_sends_to_the_judges_fix() -> None:
    detail = _probing("every label is stopped by the judge: nothing is drawn to decide on",
                      {"0": 1}, 3)
    check = genaug.doctor.check_sampling(detail, pregenerate=False, url="http://h:1")
    assert check is not None and check.fix.startswith("the judge's fix first (see pool)")
