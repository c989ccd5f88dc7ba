from __future__ import annotations

import json
from pathlib import Path

import pytest

from genaug.service.recipes.load import check_recipes, load_recipes, parse_recipes
from genaug.service.recipes.sources import load_label_sources, source_hash
from genaug.service.recipes.spec import LabelSpec, Recipe, RecipeError, pool_id

REPO = Path(__file__).resolve().parents[3]

GOOD = """\
recipes:
  - name: shapes
    description: demo
    height: 64
    width: 64
    steps: 4
    guidance: 5.0
    base_seed: 7
    labels:
      circle:
        prompts: ["a circle", "a round disc"]
        negative_prompt: text
      square:
        prompts: ["a square"]
"""


def _write(tmp_path: Path, text: str, name: str = "r.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _error(path: Path) -> str:
    with pytest.raises(RecipeError) as info:
        load_recipes(path)
    message = str(info.value)
    assert str(path) in message
    return message


@pytest.mark.parametrize("name", ["wound_phases.yaml", "generic.yaml"])
def test_shipped_recipes_load(name: str) -> None:
    recipes = load_recipes(REPO / "recipes" / name)
    assert recipes
    for recipe in recipes.values():
        assert recipe.height == recipe.width == 64 and recipe.steps == 4
        for label in recipe.label_names:
            assert recipe.plan(label, 0).prompt


def test_wound_phases_labels_in_order() -> None:
    recipe = load_recipes(REPO / "recipes" / "wound_phases.yaml")["wound-phases"]
    assert recipe.label_names == ["I", "P", "R"]
    assert all(len(spec.prompts) >= 2 for spec in recipe.labels.values())


def test_yaml_and_json_load_the_same(tmp_path: Path) -> None:
    from_yaml = load_recipes(_write(tmp_path, GOOD))
    import yaml

    data = yaml.safe_load(GOOD)
    from_json = load_recipes(_write(tmp_path, json.dumps(data), "r.json"))
    assert from_yaml == from_json
    recipe = from_yaml["shapes"]
    assert recipe.label_names == ["circle", "square"]
    assert recipe.output_size == (64, 64)
    assert recipe.labels["circle"].negative_prompt == "text"


def test_error_names_file_line_and_location(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD.replace('["a circle", "a round disc"]', '["a circle", "  "]'))
    message = _error(path)
    assert f"{path}:11: recipes[0].labels.circle.prompts[1]" in message
    assert "empty" in message


def test_error_in_second_recipe_and_bounds(tmp_path: Path) -> None:
    second = GOOD.split("\n", 1)[1].replace("name: shapes", "name: other")
    second = second.replace("height: 64", "height: 100").replace("steps: 4", "steps: 0")
    message = _error(_write(tmp_path, GOOD + second))
    assert "recipes[1].height" in message and "multiple of 8" in message and "100" in message
    assert "recipes[1].steps" in message and "greater than or equal to 1" in message


def test_unknown_key_missing_key_and_bad_name(tmp_path: Path) -> None:
    text = GOOD.replace("base_seed: 7", "seed: 7").replace("    steps: 4\n", "")
    text = text.replace("name: shapes", "name: Shapes!")
    message = _error(_write(tmp_path, text))
    assert "recipes[0].seed: unknown key" in message
    assert "recipes[0].steps: required key is missing" in message
    assert "recipes[0].name" in message and "'Shapes!'" in message


def test_wrong_types_are_not_coerced(tmp_path: Path) -> None:
    message = _error(_write(tmp_path, GOOD.replace("steps: 4", 'steps: "4"')))
    assert "recipes[0].steps" in message


def test_output_size_must_be_a_pair(tmp_path: Path) -> None:
    message = _error(_write(tmp_path, GOOD.replace("steps: 4", "steps: 4\n    output_height: 32")))
    assert "output_height and output_width go together" in message


def test_duplicate_names_and_keys(tmp_path: Path) -> None:
    message = _error(_write(tmp_path, GOOD + GOOD.split("\n", 1)[1]))
    assert "recipes[1].name: duplicate recipe name 'shapes'" in message
    dup_label = GOOD.replace("      square:", "      circle:")
    message = _error(_write(tmp_path, dup_label))
    assert "duplicate key 'circle' (first at line 10)" in message and ":13:" in message
    dup_json = '{"recipes": [], "recipes": []}'
    assert "duplicate key" in _error(_write(tmp_path, dup_json, "d.json"))


def test_bad_yaml_json_and_files(tmp_path: Path) -> None:
    message = _error(_write(tmp_path, "recipes:\n  - name: [unclosed\n"))
    assert "invalid YAML" in message and f"{tmp_path / 'r.yaml'}:" in message
    message = _error(_write(tmp_path, '{"recipes": [\n  {"name": }\n]}', "b.json"))
    assert "invalid JSON" in message and ":2:" in message
    assert "file not found" in _error(tmp_path / "missing.yaml")
    assert "unsupported file type" in _error(_write(tmp_path, GOOD, "r.txt"))
    assert "must be a mapping" in _error(_write(tmp_path, "", "empty.yaml"))
    assert "recipes: List should have at least 1 item" in _error(
        _write(tmp_path, "recipes: []\n", "none.yaml")
    )


def test_json_error_has_line_too(tmp_path: Path) -> None:
    import yaml

    data = yaml.safe_load(GOOD)
    data["recipes"][0]["guidance"] = 99
    path = _write(tmp_path, json.dumps(data, indent=2), "r.json")
    message = _error(path)
    assert "recipes[0].guidance" in message and "99" in message
    assert f"{path}:" in message and "\n" not in message  # one problem, one line


def test_spec_hash_tracks_generation_spec_only() -> None:
    recipe = parse_recipes(GOOD, path=Path("x.yaml"))["shapes"]
    base = recipe.spec_hash()
    assert base == parse_recipes(GOOD, path=Path("y.yaml"))["shapes"].spec_hash()
    assert len(base) == 64 and int(base, 16) >= 0
    assert recipe.model_copy(update={"description": "other"}).spec_hash() == base
    changed_prompt = recipe.model_copy(
        update={"labels": {**recipe.labels, "square": LabelSpec(prompts=["a box"])}}
    )
    assert changed_prompt.spec_hash() != base
    for update in ({"steps": 5}, {"guidance": 4.0}, {"base_seed": 8}, {"height": 72}):
        assert recipe.model_copy(update=update).spec_hash() != base


def test_pool_id_changes_with_model_and_spec() -> None:
    recipe = parse_recipes(GOOD, path=Path("x.yaml"))["shapes"]
    a = pool_id(recipe, "aaaa")
    assert a.startswith("shapes-") and len(a) == len("shapes-") + 12
    assert pool_id(recipe, "aaaa") == a
    assert pool_id(recipe, "bbbb") != a
    assert pool_id(recipe.model_copy(update={"steps": 5}), "aaaa") != a
    with pytest.raises(ValueError, match="model_hash"):
        pool_id(recipe, "")


def test_plan_is_deterministic_cycles_prompts_and_never_repeats_seeds() -> None:
    recipe = parse_recipes(GOOD, path=Path("x.yaml"))["shapes"]
    plan = recipe.plan_batch("circle", 0, 4)
    assert [p.prompt for p in plan] == ["a circle", "a round disc"] * 2
    assert all(p.negative_prompt == "text" for p in plan)
    assert plan == recipe.plan_batch("circle", 0, 4)
    assert recipe.plan_batch("circle", 2, 2) == plan[2:]  # resuming continues the plan
    seeds = {recipe.plan(label, k).seed for label in recipe.label_names for k in range(2000)}
    assert len(seeds) == 4000
    assert all(0 <= s < 2**63 for s in seeds)
    other = recipe.model_copy(update={"base_seed": 8})
    assert other.plan("circle", 0).seed != plan[0].seed
    with pytest.raises(KeyError, match="labels"):
        recipe.plan("triangle", 0)
    with pytest.raises(ValueError):
        recipe.plan("circle", -1)


def test_models_forbid_extra_and_are_frozen() -> None:
    with pytest.raises(ValueError):
        LabelSpec(prompts=["x"], extra=1)
    with pytest.raises(ValueError):
        LabelSpec(prompts=[])
    recipe = Recipe(
        name="r",
        labels={"a": LabelSpec(prompts=["x"])},
        height=8,
        width=8,
        steps=1,
        guidance=0.0,
    )
    with pytest.raises(ValueError):
        recipe.steps = 3


def test_spec_hash_of_a_recipe_without_new_fields_is_unchanged() -> None:
    # Pinned from genaug 0.1: pools made before scheduler/adapter/channels/images existed
    # keep their identity (and their images) after the upgrade.
    recipe = parse_recipes(GOOD, path=Path("x.yaml"))["shapes"]
    assert recipe.spec_hash() == (
        "145d799c5d77dac7704f56bb0cba3e1a4bcae013c40d3960a21ab89d982322cb")
    assert pool_id(recipe, "aaaa") == "shapes-361f7691b896"


NEW_FIELDS = GOOD.replace("    base_seed: 7\n", """    base_seed: 7
    scheduler: dpmpp_2m
    adapter: {name: lcm, scale: 0.5}
    output_channels: 1
""").replace("        negative_prompt: text\n", """        negative_prompt: text
        adapter: {name: other}
        images: real/circle
        strength: 0.3
        variants_per_image: 4
""")


def test_new_fields_parse_and_enter_the_spec_hash() -> None:
    recipe = parse_recipes(NEW_FIELDS, path=Path("x.yaml"))["shapes"]
    assert (recipe.scheduler, recipe.output_channels) == ("dpmpp_2m", 1)
    assert recipe.adapter_for("circle") is not None
    assert recipe.adapter_for("circle").name == "other"  # type: ignore[union-attr]
    assert recipe.adapter_for("circle").scale == 1.0  # type: ignore[union-attr]
    assert recipe.adapter_for("square") == recipe.adapter
    spec = recipe.labels["circle"]
    assert (spec.images, spec.strength, spec.variants_per_image) == ("real/circle", 0.3, 4)
    base = recipe.spec_hash()
    for update in ({"scheduler": "euler"}, {"output_channels": 3}, {"adapter": None}):
        assert recipe.model_copy(update=update).spec_hash() != base, update
    label = spec.model_copy(update={"strength": 0.5})
    assert recipe.model_copy(update={"labels": {**recipe.labels, "circle": label}}
                             ).spec_hash() != base


@pytest.mark.parametrize("change, where, words", [
    ("scheduler: dpmpp_2m", "recipes[0].scheduler", ["unknown scheduler", "euler_a", "'nope'"]),
    ("output_channels: 1", "recipes[0].output_channels", ["1", "3"]),
    ("adapter: {name: lcm, scale: 0.5}", "recipes[0].adapter.scale", ["less than or equal"]),
    ("images: real/circle", "recipes[0].labels.circle.images", ["GENAUG_DATA_ROOT", "'..'"]),
    ("strength: 0.3", "recipes[0].labels.circle.strength", ["greater than 0"]),
    ("variants_per_image: 4", "recipes[0].labels.circle.variants_per_image", ["1000"]),
])
def test_new_fields_are_validated(tmp_path: Path, change: str, where: str,
                                  words: list[str]) -> None:
    bad = {"scheduler: dpmpp_2m": "scheduler: nope", "output_channels: 1": "output_channels: 2",
           "adapter: {name: lcm, scale: 0.5}": "adapter: {name: lcm, scale: 9.0}",
           "images: real/circle": "images: ../outside", "strength: 0.3": "strength: 0.0",
           "variants_per_image: 4": "variants_per_image: 5000"}[change]
    message = _error(_write(tmp_path, NEW_FIELDS.replace(change, bad)))
    assert where in message, message
    for word in words:
        assert word in message, (word, message)


def test_check_recipes_names_unknown_adapters_and_bad_folders(tmp_path: Path) -> None:
    recipes = parse_recipes(NEW_FIELDS, path=Path("r.yaml"))
    with pytest.raises(RecipeError) as info:
        check_recipes(recipes, adapters={"lcm"}, data_root=None, path=Path("r.yaml"))
    problems = info.value.problems
    assert any("labels.circle.adapter: unknown adapter 'other'; loaded adapters: lcm" in p
               for p in problems), problems
    assert any("GENAUG_DATA_ROOT" in p for p in problems), problems
    with pytest.raises(RecipeError, match="unknown adapter 'lcm'.*none .set GENAUG_LORAS"):
        check_recipes(recipes, adapters=set(), data_root=tmp_path)
    (tmp_path / "real" / "circle").mkdir(parents=True)
    with pytest.raises(RecipeError, match="holds no image"):
        check_recipes(recipes, adapters={"lcm", "other"}, data_root=tmp_path)
    from PIL import Image

    Image.new("RGB", (10, 20), (200, 10, 10)).save(tmp_path / "real" / "circle" / "a.png")
    (tmp_path / "real" / "circle" / "notes.txt").write_text("not an image")
    check_recipes(recipes, adapters={"lcm", "other"}, data_root=tmp_path)  # fine now
    sources = load_label_sources(recipes["shapes"], "circle", tmp_path)
    assert [s.name for s in sources] == ["a.png"]
    assert sources[0].pixels.shape == (64, 64, 3) and sources[0].pixels.dtype.name == "uint8"
    assert sources[0].hash == source_hash(sources[0].pixels) and len(sources[0].hash) == 32
    assert load_label_sources(recipes["shapes"], "square", tmp_path) == []
    # never outside the root, not even through a symlink
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    Image.new("RGB", (8, 8)).save(outside / "x.png")
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    (root / "real" / "circle").symlink_to(outside)
    with pytest.raises(RecipeError, match="outside GENAUG_DATA_ROOT"):
        check_recipes(recipes, adapters={"lcm", "other"}, data_root=root)


def test_serve_refuses_a_recipe_naming_an_unknown_adapter(tmp_path: Path) -> None:
    """Start-up, not the first request, finds a recipe that names an adapter GENAUG_LORAS does
    not load: one line, exit 2, nothing listens."""
    import os
    import subprocess
    import sys

    path = tmp_path / "r.yaml"
    path.write_text(
        "recipes:\n  - name: inked\n    height: 64\n    width: 64\n    steps: 2\n"
        "    guidance: 3.0\n    adapter: {name: ink, scale: 0.8}\n"
        "    labels:\n      a: {prompts: [\"a\"]}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
    out = subprocess.run(
        [sys.executable, "-m", "genaug.service", "--recipes", str(path), "--port", "0",
         "--pool-path", str(tmp_path / "pool.db")],
        capture_output=True, text=True, env=env, timeout=180,
    )
    assert out.returncode == 2, out.stderr
    assert "unknown adapter 'ink'" in out.stderr and "GENAUG_LORAS" in out.stderr
    assert len(out.stderr.strip().splitlines()) <= 2, out.stderr


def test_speed_is_checked_at_start_and_enters_the_pool_identity(tmp_path: Path) -> None:
    """``speed: auto`` needs a judge, ``speed: turbo`` a service that serves turbo; both are
    one line at start-up. turbo and auto pools are pools of their own (other images), and a
    stored spec of either reads back for the export (which needs no judge)."""
    from genaug.service.pool.open import open_pool

    text = (REPO / "recipes" / "digits.yaml").read_text()
    auto = parse_recipes(text.replace("    base_seed: 0", "    base_seed: 0\n    speed: auto"),
                         path=Path("r.yaml"))
    with pytest.raises(RecipeError) as info:
        check_recipes(auto, path=Path("r.yaml"))
    (problem,) = info.value.problems
    assert problem.startswith("r.yaml: recipe 'digits' speed: 'auto' chooses the cheapest")
    assert "add a judge block" in problem
    turbo = parse_recipes(text.replace("    base_seed: 0", "    base_seed: 0\n    speed: turbo"),
                          path=Path("r.yaml"))
    check_recipes(turbo, turbo=True)
    with pytest.raises(RecipeError, match="GENAUG_TURBO_LORA"):
        check_recipes(turbo, turbo=False)
    quality = parse_recipes(text, path=Path("r.yaml"))["digits"]
    ids = {pool_id(r, "m") for r in (quality, turbo["digits"], auto["digits"])}
    assert len(ids) == 3
    assert "speed" not in quality.spec() and auto["digits"].spec()["speed"] == "auto"
    with open_pool(tmp_path / "pool.db", capacity_per_label=10) as store:
        pid = pool_id(auto["digits"], "m")
        store.recipe_specs.record(pid, auto["digits"])
        back = store.recipe_specs.read(pid)
    assert back is not None and back.speed == "auto" and back.plan("3", 5) == auto[
        "digits"].plan("3", 5)
