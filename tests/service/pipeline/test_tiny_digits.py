"""The embedded default, tiny-digits: packaged weights that load, draw the digit asked for,
and give the same image for the same seed; and the settings that pick a built-in model. Also
tiny-digits-base, the same trained on digits 0-4 only: it loads, is another model, says what
it was trained on."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from genaug.service.pipeline.load import MODEL_KINDS, LoadedModel, load_model
from genaug.service.pipeline.tiny import build_tiny_digits_pipeline, tiny_digits_weights
from genaug.service.settings import Settings
from genaug.service.testing import start_service

ROOT = Path(__file__).resolve().parents[3]
RECIPE = yaml.safe_load((ROOT / "recipes" / "digits.yaml").read_text())["recipes"][0]
REFERENCE = Path(__file__).parent / "data" / "tiny_digits_3_seed7.png"
# The batch-invariant pipeline is bit-exact on one machine; other CPUs (kernels, thread
# counts) may round differently by a few uint8 levels, never more than this.
REFERENCE_TOLERANCE = 6


def generate(pipeline: Any, prompts: list[str], seeds: list[int]) -> np.ndarray:
    with torch.inference_mode():
        images = pipeline(
            prompts, num_inference_steps=RECIPE["steps"], guidance_scale=RECIPE["guidance"],
            height=64, width=64, output_type="np",
            generator=[torch.Generator().manual_seed(s) for s in seeds],
        ).images
    assert np.isfinite(images).all()
    result: np.ndarray = (images * 255).round().astype(np.uint8)
    return result


@pytest.fixture(scope="module")
def digits_model() -> LoadedModel:
    return load_model(source=None, unet_weights=None, device="cpu", dtype="auto")


def test_the_default_is_the_packaged_trained_pipeline(digits_model: LoadedModel) -> None:
    assert (digits_model.kind, digits_model.source) == ("tiny-digits", "tiny-digits")
    assert digits_model.kind in MODEL_KINDS
    named = load_model(source="tiny-digits", unet_weights=None, device="cpu", dtype="auto")
    assert named.weights_hash == digits_model.weights_hash
    random = load_model(source="tiny-random", unet_weights=None, device="cpu", dtype="auto")
    assert random.weights_hash != digits_model.weights_hash
    trained_on = digits_model.trained_on
    assert trained_on is not None
    assert trained_on["dataset"] == "sklearn load_digits" and trained_on["split"] == "generator"
    assert trained_on["script"] == "tools/train_tiny_generator.py"
    assert {"script_version", "seed", "vae_steps", "unet_steps"} <= trained_on.keys()
    # The recipe's prompts are exactly the ones the weights were trained with.
    assert trained_on["labels"] == {k: v["prompts"] for k, v in RECIPE["labels"].items()}


def test_package_data_is_small_and_documented() -> None:
    path = tiny_digits_weights()
    assert path.is_file() and path.parent.name == "weights"
    assert path.stat().st_size <= 20 * 1024 * 1024
    record = json.loads((path.parent / "tiny_digits.json").read_text())
    _, trained_on = build_tiny_digits_pipeline(batch_invariant=False)
    assert record == trained_on


def test_fixed_seed_image_is_stable(digits_model: LoadedModel) -> None:
    from PIL import Image

    image = generate(digits_model.pipeline, ["a handwritten three"], [7])[0]
    if os.environ.get("GENAUG_UPDATE_REFERENCE"):
        REFERENCE.parent.mkdir(exist_ok=True)
        Image.fromarray(image).save(REFERENCE)
    reference = np.asarray(Image.open(REFERENCE).convert("RGB"))
    diff = np.abs(image.astype(int) - reference.astype(int))
    assert diff.max() <= REFERENCE_TOLERANCE, f"max diff {diff.max()}, mean {diff.mean():.3f}"
    # Alone or in a batch, the same image.
    batch = generate(digits_model.pipeline, ["a handwritten one", "a handwritten three"], [1, 7])
    np.testing.assert_array_equal(batch[1], image)


def test_fidelity_at_a_small_size() -> None:
    """The benchmark's goal is >= 95 % of >= 200 images (docs/benchmarks.md); here 30."""
    pytest.importorskip("sklearn")
    from genaug.digits import PROMPTS, fidelity

    pipeline, _ = build_tiny_digits_pipeline(batch_invariant=False)
    labels = [d for d in range(10) for _ in range(3)]
    images = generate(pipeline, [PROMPTS[str(d)] for d in labels],
                      [500 + i for i in range(len(labels))])
    assert images.std() > 20  # not blank
    assert fidelity(images, labels) >= 0.8


def test_builtin_model_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("GENAUG_MODEL", raising=False)
    unset = Settings()
    assert (unset.model, unset.builtin_model, unset.model_path) == (None, "tiny-digits", None)
    assert unset.request_defaults() == (64, RECIPE["steps"], RECIPE["guidance"])
    assert Settings(model="tiny-random").request_defaults() == (64, 4, 5.0)
    assert Settings(model="tiny-digits").builtin_model == "tiny-digits"
    folder = Settings(model=str(tmp_path))
    assert folder.builtin_model is None and folder.model_path == tmp_path
    assert folder.request_defaults() == (1024, 30, 5.0)
    assert Settings(model=tmp_path).model == str(tmp_path)  # a Path is accepted too
    assert Settings(model="tiny-random", default_steps=9).request_defaults()[1] == 9
    monkeypatch.setenv("GENAUG_MODEL", "")
    assert Settings().builtin_model == "tiny-digits"
    monkeypatch.setenv("GENAUG_MODEL", "tiny-random")
    assert Settings().builtin_model == "tiny-random"


def test_the_service_reports_and_defaults_by_model(digits_model: LoadedModel) -> None:
    import httpx

    with start_service(digits_model, max_batch_images=4, warmup=False) as live:
        info = httpx.get(live.url + "/v1/info").json()
        assert info["model"]["kind"] == "tiny-digits"
        assert info["model"]["hash"] == digits_model.weights_hash
        assert info["model"]["trained_on"] == digits_model.trained_on
        response = httpx.post(live.url + "/v1/generate", json={"prompt": "a handwritten two",
                                                                "seed": 3}, timeout=60)
        assert response.status_code == 200, response.text
        assert live.worker is not None
        key, items = live.worker.calls[-1]
        assert (key.steps, key.height, items[0].guidance) == (
            RECIPE["steps"], 64, RECIPE["guidance"])


# -- tiny-digits-base: the same pipeline trained on digits 0-4 only (issue 19) --


@pytest.fixture(scope="module")
def base_model() -> LoadedModel:
    return load_model(source="tiny-digits-base", unet_weights=None, device="cpu", dtype="auto")


def test_the_base_never_saw_five_to_nine(base_model: LoadedModel,
                                         digits_model: LoadedModel) -> None:
    assert (base_model.kind, base_model.source) == ("tiny-digits-base", "tiny-digits-base")
    assert base_model.kind in MODEL_KINDS
    assert base_model.weights_hash != digits_model.weights_hash
    trained_on = base_model.trained_on
    assert trained_on is not None
    assert trained_on["dataset"] == "sklearn load_digits" and trained_on["split"] == "generator"
    assert trained_on["script"] == "tools/train_tiny_generator.py"
    # Trained on digits 0-4 of the generator split only, with the recipe's prompts for them.
    assert trained_on["labels"] == {k: v["prompts"] for k, v in RECIPE["labels"].items()
                                    if int(k) <= 4}
    assert {"seed", "vae_steps", "unet_steps", "script_version"} <= trained_on.keys()
    # The package record next to the weights is the header's.
    path = tiny_digits_weights("tiny-digits-base")
    assert path.name == "tiny_digits_base.safetensors"
    assert path.stat().st_size <= 20 * 1024 * 1024
    assert json.loads(path.with_suffix(".json").read_text()) == trained_on
    # Its text encoders take every digit's prompt (the tokenizer is shared); it tells them apart.
    with torch.inference_mode():
        embeds = base_model.pipeline.encode_prompt(
            ["a handwritten two", "a handwritten seven"], device=torch.device("cpu"),
            num_images_per_prompt=1, do_classifier_free_guidance=False)[0]
    assert embeds.shape[0] == 2 and torch.isfinite(embeds).all()
    assert not torch.allclose(embeds[0], embeds[1])


def test_base_settings_and_info(base_model: LoadedModel) -> None:
    from genaug.service.api.status import info_of
    from genaug.service.app import create_app

    settings = Settings(model="tiny-digits-base")
    assert (settings.builtin_model, settings.model_path) == ("tiny-digits-base", None)
    assert settings.request_defaults() == (64, RECIPE["steps"], RECIPE["guidance"])
    # What GET /v1/info answers, without starting a server.
    state = create_app(settings).state.genaug
    state.model = base_model
    info = info_of(state).model_dump(mode="json")
    assert info["model"]["kind"] == "tiny-digits-base"
    assert info["model"]["hash"] == base_model.weights_hash
    assert info["model"]["trained_on"] == base_model.trained_on
    assert sorted(info["model"]["trained_on"]["labels"]) == ["0", "1", "2", "3", "4"]
    assert info["limits"]["default_steps"] == RECIPE["steps"]
