"""Prompts over the text encoders' 77 tokens: reported once per prompt when the service
starts, never per batch; the recipes this repository ships fit; third-party lines that say
nothing to a user (torchvision fallbacks) are dropped."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from genaug.service.pipeline.sampler import prompt_tokens
from genaug.service.pipeline.tiny import build_tiny_pipeline
from genaug.service.recipes.load import load_recipes, long_prompts

ROOT = Path(__file__).resolve().parents[3]
LONG = " ".join(["a circle"] * 12)  # 107 characters: more than 77 tokens in any CLIP


@pytest.fixture(scope="module")
def counter() -> tuple[Any, int]:
    return prompt_tokens(build_tiny_pipeline())


@pytest.mark.parametrize("path", sorted((ROOT / "recipes").glob("*.yaml")), ids=lambda p: p.name)
def test_the_shipped_recipes_fit_the_text_encoders(path: Path, counter: tuple[Any, int]) -> None:
    count, limit = counter
    assert limit == 77
    assert long_prompts(load_recipes(path), count, limit, path=path) == []


def test_a_long_prompt_is_reported_with_its_count_and_the_fix(
    tmp_path: Path, shapes_recipe: str, counter: tuple[Any, int]
) -> None:
    path = tmp_path / "recipes.yaml"
    path.write_text(shapes_recipe.replace('["a square"]', f'["{LONG}", "{LONG}"]')
                    .replace('"blurry"', f'"{LONG}"'))
    count, limit = counter
    lines = long_prompts(load_recipes(path), count, limit, path=path)
    # one line per distinct text, however often it appears
    assert len(lines) == 1, lines
    assert count(LONG) > 77
    assert f"labels.square.prompts[0] is {count(LONG)} tokens" in lines[0], lines
    assert "over the text encoders' 77" in lines[0] and "shorten it" in lines[0], lines


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_the_service_says_it_once_and_batches_stay_quiet(
    make_service: Any, tmp_path: Path, shapes_recipe: str, caplog: pytest.LogCaptureFixture
) -> None:
    # diffusers and transformers log through their own handlers (not propagated): listen on
    # the very loggers that warn, behind their filters
    third_party = _Collect()
    loggers = [logging.getLogger(name) for name in (
        "diffusers.pipelines.stable_diffusion_xl.pipeline_stable_diffusion_xl",
        "transformers.tokenization_utils_base")]
    for logger in loggers:
        logger.addHandler(third_party)
    path = tmp_path / "recipes.yaml"
    path.write_text(shapes_recipe.replace('["a square"]', f'["{LONG}"]'))
    try:
        with caplog.at_level(logging.INFO):
            live = make_service(recipes=path, pool_path=tmp_path / "pool.db",
                                pool_capacity_per_label=24, max_batch_images=4)
            pools = live.state.pools
            deadline = time.monotonic() + 60  # every square image is made from the long prompt
            while sum(pools.store.fill(pools.pool_ids["shapes"]).values()) < 72:
                assert time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        for logger in loggers:
            logger.removeHandler(third_party)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("over the text encoders' 77" in m for m in messages) == 1, messages
    assert third_party.messages == [], third_party.messages[:3]


def test_no_torchvision_fallback_lines_on_start() -> None:
    # once per process, at diffusers' import: a fresh process shows them or not
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", "from genaug.service.pipeline.tiny import build_tiny_pipeline; "
         "build_tiny_pipeline()"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "requires torchvision" not in run.stderr, run.stderr
