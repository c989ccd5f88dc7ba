"""A recipe's ``judge:`` block: parsed, validated with the fix, and outside the pool identity."""

from __future__ import annotations

from pathlib import Path

import pytest

from genaug.service.recipes.load import check_recipes, load_recipes, parse_recipes
from genaug.service.recipes.spec import RecipeError, pool_id

BASE = """\
recipes:
  - name: digits
    height: 64
    width: 64
    steps: 4
    guidance: 3.0
    labels:
      "5": {prompts: [a handwritten five]}
      "6": {prompts: [a handwritten six]}
"""


def _with(judge: str, base: str = BASE) -> str:
    return base.replace("    labels:", f"    judge: {judge}\n    labels:")


def _error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "r.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RecipeError) as info:
        load_recipes(path)
    return str(info.value)


def test_the_judge_parses_with_defaults_and_keeps_the_pool_id() -> None:
    plain = parse_recipes(BASE, path=Path("r.yaml"))["digits"]
    judged = parse_recipes(_with("{shots: digits/shots}"), path=Path("r.yaml"))["digits"]
    assert judged.judge is not None
    assert (judged.judge.encoder, judged.judge.rule, judged.judge.min_score) == (
        "tiny-digits-encoder", "shots", 0.9)
    # It changes what is sampled, never what is generated: same pool, same images.
    assert judged.spec_hash() == plain.spec_hash()
    assert pool_id(judged, "m") == pool_id(plain, "m")
    other = parse_recipes(_with("{shots: x, min_score: 0.9}"), path=Path("r.yaml"))["digits"]
    assert pool_id(other, "m") == pool_id(plain, "m")


@pytest.mark.parametrize("judge, where, words", [
    ("{shots: s, min_score: 1.5}", "recipes[0].judge.min_score",
     ["min_score 1.5 is outside 0..1", "between 0 and 1 (e.g. 0.8)"]),
    ("{shots: s, min_score: -0.1}", "recipes[0].judge.min_score", ["-0.1", "outside 0..1"]),
    ("{shots: s, rule: vote}", "recipes[0].judge.rule", ["'vote' is unknown", "'shots'",
                                                         "'prompts'"]),
    ("{shots: s, rule: prompts}", "recipes[0].judge", ["text tower", "tiny-digits-encoder",
                                                       "use rule: shots"]),
    ("{shots: /data/shots}", "recipes[0].judge.shots", ["relative to GENAUG_DATA_ROOT",
                                                        "'/data/shots'"]),
    ("{shots: ../shots}", "recipes[0].judge.shots", ["without '..'"]),
    ("{shots: s, encoder: ''}", "recipes[0].judge.encoder", ["tiny-digits-encoder"]),
    ("{shots: s, size: 3}", "recipes[0].judge.size", ["unknown key"]),
    ("{rule: shots}", "recipes[0].judge.shots", ["required key is missing"]),
])
def test_bad_judges_name_the_field_value_limit_and_fix(tmp_path: Path, judge: str, where: str,
                                                       words: list[str]) -> None:
    message = _error(tmp_path, _with(judge))
    assert where in message, message
    for word in words:
        assert word in message, (word, message)


def test_the_shots_rule_needs_two_labels(tmp_path: Path) -> None:
    one = BASE.replace('      "6": {prompts: [a handwritten six]}\n', "")
    message = _error(tmp_path, _with("{shots: s}", one))
    assert "needs at least 2 labels" in message and "rule: prompts" in message, message


def test_check_recipes_names_missing_shots_labels_and_encoders(tmp_path: Path) -> None:
    from PIL import Image

    recipes = parse_recipes(_with("{shots: shots}"), path=Path("r.yaml"))
    with pytest.raises(RecipeError, match=r"judge.shots: 'shots' needs GENAUG_DATA_ROOT"):
        check_recipes(recipes, data_root=None, path=Path("r.yaml"))
    with pytest.raises(RecipeError, match=r"judge.shots: 'shots'.* is not a folder"):
        check_recipes(recipes, data_root=tmp_path)
    (tmp_path / "shots" / "5").mkdir(parents=True)
    Image.new("RGB", (8, 8), (255, 255, 255)).save(tmp_path / "shots" / "5" / "a.png")
    with pytest.raises(RecipeError) as info:
        check_recipes(recipes, data_root=tmp_path)
    message = str(info.value)
    assert "no images for label '6'" in message and "every label needs a subfolder" in message
    (tmp_path / "shots" / "6").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "shots" / "6" / "b.png")
    check_recipes(recipes, data_root=tmp_path)  # fine now
    missing = parse_recipes(_with(f"{{shots: shots, encoder: {tmp_path / 'clip'}}}"),
                            path=Path("r.yaml"))
    with pytest.raises(RecipeError) as info:
        check_recipes(missing, data_root=tmp_path)
    message = str(info.value)
    assert "judge.encoder:" in message and "config.json not found" in message, message
    assert "save_pretrained" in message


@pytest.mark.parametrize("bad", ["text", "cut short"])
def test_a_shot_or_a_variants_image_that_is_not_an_image_is_refused_naming_the_file(
        tmp_path: Path, bad: str) -> None:
    """``echo x > shots/6/fake.png``, or a PNG cut short (its header alone would pass):
    refused when the recipes load, naming the file, never when the judge reads it at start."""
    import io

    from PIL import Image

    for folder in ("shots/5", "shots/6", "real"):
        (tmp_path / folder).mkdir(parents=True)
        Image.new("RGB", (8, 8), (255, 255, 255)).save(tmp_path / folder / "a.png")
    whole = io.BytesIO()
    Image.new("RGB", (64, 64), (10, 200, 30)).save(whole, "PNG")
    data = b"x\n" if bad == "text" else whole.getvalue()[: len(whole.getvalue()) // 2]
    judged = parse_recipes(_with("{shots: shots}"), path=Path("r.yaml"))
    check_recipes(judged, data_root=tmp_path)  # fine first
    (tmp_path / "shots" / "6" / "fake.png").write_bytes(data)
    with pytest.raises(RecipeError) as info:
        check_recipes(judged, data_root=tmp_path, path=Path("r.yaml"))
    message = str(info.value)
    assert message.count("\n") == 0 and "judge.shots: 'shots': " in message, message
    assert f"{tmp_path / 'shots' / '6' / 'fake.png'} is not an image (" in message, message
    varied = parse_recipes(BASE.replace('"6": {prompts: [a handwritten six]}',
                                        '"6": {prompts: [a six], images: real}'),
                           path=Path("r.yaml"))
    check_recipes(varied, data_root=tmp_path)
    (tmp_path / "real" / "b.jpg").write_bytes(data)
    with pytest.raises(RecipeError, match=r"labels\.6\.images: 'real': .*b\.jpg is not an "
                                          r"image \(.*remove it, or replace it"):
        check_recipes(varied, data_root=tmp_path, path=Path("r.yaml"))
