"""``intake/plan.py``: a request (or a pool batch) becomes the exact work it stands for.

Plain objects, no model: requests validated by the app's own per-app models
(:func:`build_api_models`), defaults from the settings as the app takes them
(``Settings.request_defaults``), pool batches from the shipped wound-phases recipe.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from genaug.service.batching.items import GroupKey
from genaug.service.intake.fields import SEED_MAX
from genaug.service.intake.plan import plan_items, plan_pool_batch, plan_variants
from genaug.service.intake.schemas import ApiModels, build_api_models
from genaug.service.intake.uploads import Upload
from genaug.service.recipes.load import load_recipes
from genaug.service.recipes.sources import SourceImage, source_hash
from genaug.service.recipes.spec import Recipe
from genaug.service.sampling.modes import turbo_mode
from genaug.service.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
RECIPE = load_recipes(ROOT / "recipes" / "wound_phases.yaml")["wound-phases"]
LABEL = RECIPE.label_names[1]
#: A prompt as long as the shipped recipe's (the first template of a label).
PROMPT = RECIPE.labels[LABEL].prompts[0]
SETTINGS = Settings(model="tiny-random", max_n=8, max_variant_sources=3)
DEFAULTS = SETTINGS.request_defaults()


def _models() -> ApiModels:
    return build_api_models(SETTINGS, recipes={RECIPE.name: RECIPE}, adapters=("ink",),
                            defaults=DEFAULTS, turbo=turbo_mode(SETTINGS))


def _generate(**body: Any) -> Any:
    return _models().generate.model_validate_json(json.dumps({"prompt": PROMPT, **body}))


def _upload(count: int, **params: Any) -> Upload:
    rng = np.random.default_rng(3)
    sources = [rng.integers(0, 256, size=(48, 80, 3), dtype=np.uint8) for _ in range(count)]
    body = json.dumps({"prompt": PROMPT, **params})
    return Upload(sources=sources, params=_models().variants.model_validate_json(body))


def test_a_given_seed_numbers_the_images_up_to_the_largest_seed() -> None:
    # The schema's largest first seed: the last image of the largest request is 2**63 - 1.
    top = SEED_MAX - (SETTINGS.max_n - 1)
    _, items = plan_items(_generate(seed=top, n=SETTINGS.max_n), DEFAULTS)
    assert [item.seed for item in items] == list(range(top, SEED_MAX + 1))
    assert {item.prompt for item in items} == {PROMPT}


def test_drawn_seeds_are_63_bit_distinct_and_new_each_request() -> None:
    first = [item.seed for item in plan_items(_generate(n=8), DEFAULTS)[1]]
    second = [item.seed for item in plan_items(_generate(n=8), DEFAULTS)[1]]
    assert all(type(seed) is int and 0 <= seed < SEED_MAX for seed in first + second)
    assert len(set(first)) == 8
    assert first != second
    # 63-bit seeds, not small ones: eight draws below 2**53 would happen once in 2**80.
    assert max(first) >= 2**53


def test_omitted_fields_take_the_settings_defaults() -> None:
    assert DEFAULTS == (64, 4, 5.0)  # tiny-random's defaults
    key, items = plan_items(_generate(n=2, seed=7), DEFAULTS)
    assert key == GroupKey(height=64, width=64, steps=4, scheduler="default", adapter=None,
                           adapter_scale=1.0)
    assert [(i.guidance, i.output_height, i.output_width) for i in items] == [(5.0, 64, 64)] * 2
    assert [i.negative_prompt for i in items] == [None, None]


def test_given_fields_override_the_defaults_and_zero_guidance_is_kept() -> None:
    key, items = plan_items(_generate(height=32, width=96, steps=2, guidance=0,
                                      output_height=16, negative_prompt="blurry", seed=1),
                            DEFAULTS)
    assert (key.height, key.width, key.steps) == (32, 96, 2)
    # guidance 0 is a choice (no guidance), not "left out"; one output side keeps the ratio.
    assert (items[0].guidance, items[0].output_height, items[0].output_width) == (0.0, 16, 48)
    assert items[0].negative_prompt == "blurry"


def test_the_group_key_is_the_work_not_the_request() -> None:
    base, _ = plan_items(_generate(seed=1), DEFAULTS)
    other, _ = plan_items(_generate(seed=99, n=3, guidance=2.0, prompt="a red circle"),
                          DEFAULTS)
    assert other == base  # prompt, seed, count and guidance vary per item inside one batch
    # Without an adapter its scale means nothing: normalised, so the work still shares a batch.
    with_scale, _ = plan_items(_generate(adapter_scale=2.5), DEFAULTS)
    assert with_scale == base
    adapted, _ = plan_items(_generate(adapter="ink"), DEFAULTS)
    assert (adapted.adapter, adapted.adapter_scale) == ("ink", 1.0)
    assert adapted != base
    assert plan_items(_generate(steps=5), DEFAULTS)[0] != base


def test_variants_are_source_major_with_consecutive_seeds() -> None:
    # The schema's largest first seed for variants (max_n per source, max_variant_sources).
    top = SEED_MAX - (SETTINGS.max_n * SETTINGS.max_variant_sources - 1)
    upload = _upload(3, n_per_image=4, seed=top, strength=0.3)
    key, items, sources = plan_variants(upload, DEFAULTS)
    assert key == GroupKey(height=48, width=80, steps=4, mode="img2img", strength=0.3)
    assert len(items) == 12
    for j, source in enumerate(upload.sources):
        for k in range(4):
            item = items[j * 4 + k]
            assert item.seed == top + j * 4 + k
            assert item.source is source
            assert item.source_hash == source_hash(source)
            assert (item.guidance, item.output_height, item.output_width) == (5.0, 48, 80)
    assert sources.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert sources.dtype == np.int32


def test_variants_without_a_seed_draw_one_63_bit_seed_per_image() -> None:
    _, items, _ = plan_variants(_upload(2, n_per_image=3), DEFAULTS)
    seeds = [item.seed for item in items]
    assert len(set(seeds)) == 6
    assert all(type(seed) is int and 0 <= seed < SEED_MAX for seed in seeds)


def _pool_sources(recipe: Recipe) -> list[SourceImage]:
    rng = np.random.default_rng(5)
    out = []
    for name in ("a.png", "b.png"):
        pixels = rng.integers(0, 256, size=(recipe.height, recipe.width, 3), dtype=np.uint8)
        out.append(SourceImage(name, pixels, source_hash(pixels)))
    return out


@pytest.mark.parametrize("with_sources", [False, True], ids=["text", "img2img"])
def test_a_pool_batch_is_the_recipe_plan_at_the_reserved_indices(with_sources: bool) -> None:
    indices = [4, 5, 6, 7]
    sources = _pool_sources(RECIPE) if with_sources else []
    key, items = plan_pool_batch(RECIPE, LABEL, indices, sources)
    plan = [RECIPE.plan(LABEL, index) for index in indices]
    assert [item.prompt for item in items] == [p.prompt for p in plan]
    assert [item.seed for item in items] == [p.seed for p in plan]
    assert [item.negative_prompt for item in items] == [p.negative_prompt for p in plan]
    # The recipe's templates cycle, and its seeds are 63-bit hashes, distinct per index.
    assert len({item.prompt for item in items}) == len(RECIPE.labels[LABEL].prompts)
    assert len({item.seed for item in items}) == 4
    assert all(0 <= item.seed <= SEED_MAX for item in items)
    assert key.height == RECIPE.height and key.width == RECIPE.width
    assert (key.steps, key.scheduler) == (RECIPE.steps, RECIPE.scheduler)
    assert {(i.guidance, i.output_height, i.output_width, i.channels) for i in items} == {
        (RECIPE.guidance, *RECIPE.output_size, RECIPE.output_channels)}
    if with_sources:
        assert (key.mode, key.strength) == ("img2img", RECIPE.labels[LABEL].strength)
        # plan index k takes source k mod 2, and keeps its hash.
        assert [item.source_hash for item in items] == [sources[i % 2].hash for i in indices]
        pixels = [sources[i % 2].pixels for i in indices]
        assert all(item.source is p for item, p in zip(items, pixels, strict=True))
    else:
        assert (key.mode, key.strength) == ("text", 1.0)
        assert {(item.source is None, item.source_hash) for item in items} == {(True, None)}
