"""The judge on the embedded tiny encoder and on a tiny random CLIP (both rules)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from genaug.service.judge import build_judge, build_judges
from genaug.service.judge.encoders import TransformersEncoder
from genaug.service.judge.rules import augmented_views
from genaug.service.recipes.load import check_recipes, parse_recipes
from genaug.service.recipes.spec import Recipe, RecipeError

CPU = torch.device("cpu")


def _recipe(judge: str, labels: dict[str, str], size: int = 64) -> Recipe:
    lines = ["recipes:", "  - name: judged", f"    height: {size}", f"    width: {size}",
             "    steps: 2", "    guidance: 3.0", f"    judge: {judge}", "    labels:"]
    lines += [f'      "{k}": {{prompts: ["{v}"]}}' for k, v in labels.items()]
    return parse_recipes("\n".join(lines) + "\n", path=Path("r.yaml"))["judged"]


DIGITS = {str(d): f"a handwritten {w}" for d, w in
          zip(range(5, 10), ("five", "six", "seven", "eight", "nine"), strict=True)}


def test_tiny_encoder_scores_real_unseen_digits_by_their_label(digit_shots: Path) -> None:
    from genaug.digits import load_split

    recipe = _recipe("{shots: shots}", DIGITS)
    check_recipes({"judged": recipe}, data_root=digit_shots)
    judge = build_judges({"judged": recipe}, digit_shots, CPU)["judged"]
    images, labels = load_split("test")
    hits = []
    for d in range(5, 10):
        mine = images[labels == d]
        scores = judge.score(mine, str(d))
        assert scores.dtype == np.float32 and scores.shape == (len(mine),)
        assert ((scores >= 0) & (scores <= 1)).all()
        others = judge.score(images[(labels >= 5) & (labels != d)], str(d))
        assert scores.mean() > 0.5 > others.mean(), (d, scores.mean(), others.mean())
        hits.append(judge.keep(scores).mean())
    # 5 shots per class, digits the encoder never saw: most real digits pass min_score 0.8
    assert judge.min_score == 0.8 and np.mean(hits) > 0.6, hits
    assert judge.score(images[:0], "5").shape == (0,)
    with pytest.raises(KeyError, match="no label '3'"):
        judge.score(images[:1], "3")


def test_augmented_views_shift_within_the_image() -> None:
    images = np.zeros((2, 32, 32, 3), np.uint8)
    images[:, 12:20, 12:20] = 255
    views = augmented_views(images, 4, seed=1)
    assert views.shape == (10, 32, 32, 3)
    assert (views[:2] == images).all()
    assert all(int(v.sum()) == int(images[0].sum()) for v in views)  # shifted, not cut
    assert not all((v == images[0]).all() for v in views[2:])


def _colour_shots(root: Path) -> None:
    from PIL import Image

    for label, colour in (("red", (220, 20, 20)), ("blue", (20, 20, 220))):
        (root / "shots" / label).mkdir(parents=True)
        for k in range(3):
            shade = tuple(max(0, c - 30 * k) for c in colour)
            Image.new("RGB", (48, 48), shade).save(root / "shots" / label / f"{k}.png")


def test_tiny_clip_both_rules(tmp_path: Path, tiny_clip_dir: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _colour_shots(tmp_path)
    labels = {"red": "a red square", "blue": "a blue square"}
    red = np.full((4, 64, 64, 3), (200, 30, 30), np.uint8)
    blue = np.full((4, 64, 64, 3), (30, 30, 200), np.uint8)
    shots = _recipe(f"{{shots: shots, encoder: {tiny_clip_dir}}}", labels)
    prompts = _recipe(f"{{shots: shots, encoder: {tiny_clip_dir}, rule: prompts, "
                      "min_score: 0.4}", labels)
    check_recipes({"a": shots, "b": prompts}, data_root=tmp_path)
    judges = build_judges({"a": shots, "b": prompts}, tmp_path, CPU)
    assert isinstance(judges["a"].encoder, TransformersEncoder)
    assert judges["a"].encoder is judges["b"].encoder  # loaded once, shared
    # shots: a classifier fitted on the shots' CLIP embeddings tells the colours apart
    judge = judges["a"]
    assert judge.score(red, "red").min() > 0.5 > judge.score(red, "blue").max()
    assert judge.score(blue, "blue").min() > 0.5
    # prompts: zero-shot probabilities over the labels (random weights: any split, but one)
    zero = judges["b"]
    p_red, p_blue = zero.score(red, "red"), zero.score(red, "blue")
    assert p_red.dtype == np.float32 and p_red.shape == (4,)
    np.testing.assert_allclose(p_red + p_blue, 1.0, atol=1e-5)
    assert zero.min_score == 0.4 and zero.describe()["rule"] == "prompts"
    one_channel = zero.score(red[..., :1], "red")  # luminance images are encoded too
    assert one_channel.shape == (4,)


def test_a_vision_only_model_takes_the_shots_rule_not_the_prompts_rule(
        tmp_path: Path, tiny_vision_dir: Path) -> None:
    _colour_shots(tmp_path)
    labels = {"red": "a red square", "blue": "a blue square"}
    recipe = _recipe(f"{{shots: shots, encoder: {tiny_vision_dir}}}", labels)
    judge = build_judge(recipe, tmp_path, CPU)
    assert not judge.encoder.has_text
    red = np.full((2, 64, 64, 3), (200, 30, 30), np.uint8)
    assert judge.score(red, "red").min() > 0.5
    prompts = _recipe(f"{{shots: shots, encoder: {tiny_vision_dir}, rule: prompts}}", labels)
    with pytest.raises(RecipeError) as info:
        check_recipes({"judged": prompts}, data_root=tmp_path)
    message = str(info.value)
    assert "judge.rule: 'prompts' needs an encoder with a text tower" in message, message
    assert "clip_vision_model" in message and "use rule: shots" in message
