"""Loading recipes files: YAML or JSON parsing with line numbers, and start-up checks.

:func:`load_recipes` reads ``GENAUG_RECIPES`` (the format is described in
:mod:`genaug.service.recipes.spec`); :func:`parse_recipes` does the same from text. Every
problem becomes one line of a :class:`~genaug.service.recipes.spec.RecipeError`:
``"<file>[:line]: <location>: <what is wrong>"``, the line found by walking the composed YAML
tree along pydantic's error location. :func:`check_recipes` runs the checks that need the
running configuration (loaded adapters, label image folders).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..sampling.modes import turbo_refusal
from .sources import encoder_config, has_text_tower, resolve_images_folder, resolve_shots
from .spec import LABEL_CHARS, TINY_ENCODER, Recipe, RecipeError

__all__ = ["check_recipes", "load_recipes", "long_prompts", "parse_recipes"]

log = logging.getLogger(__name__)


def check_recipes(
    recipes: Mapping[str, Recipe],
    *,
    adapters: Collection[str] = (),
    data_root: Path | None = None,
    path: Path | None = None,
    turbo: bool = True,
) -> None:
    """Start-up checks that need the running configuration: every adapter a recipe names is
    loaded (``adapters``: the names of ``GENAUG_LORAS``), ``speed: turbo`` only where the
    service serves turbo (``turbo``: its turbo mode is not None),
    ``speed: auto`` only with a judge (a stored spec holds no judge, so the model cannot),
    every label image folder exists
    under ``data_root`` and holds images, and a judge's shots folder holds images for every
    label and its encoder folder exists (with a text tower for the ``prompts`` rule).
    Schedulers are checked when the file is parsed.

    Raises :class:`RecipeError`, one line per problem (the service exits 2 with it)::

        check_recipes(recipes, adapters={"wound-lora"}, data_root=Path("/data/real"))
    """
    problems = []
    where = str(path) if path is not None else "recipes"
    known = ", ".join(sorted(adapters)) or "none (set GENAUG_LORAS=name=path)"
    for name, recipe in recipes.items():
        if recipe.speed == "turbo" and not turbo:
            problems.append(f"{where}: recipe {name!r} speed: {turbo_refusal()}")
        if recipe.speed == "auto" and recipe.judge is None:
            problems.append(
                f"{where}: recipe {name!r} speed: 'auto' chooses the cheapest sampler whose "
                "images the judge accepts as often as the recipe's own, and this recipe has "
                "no judge: add a judge block (shots of real images per label), or use speed "
                "'quality' or 'turbo'")
        for label in recipe.label_names:
            adapter = recipe.adapter_for(label)
            if adapter is not None and adapter.name not in adapters:
                own = recipe.labels[label].adapter is not None
                loc = f"labels.{label}.adapter" if own else "adapter"
                problems.append(f"{where}: recipe {name!r} {loc}: unknown adapter "
                                f"{adapter.name!r}; loaded adapters: {known}")
            folder = recipe.labels[label].images
            if folder is not None:
                try:
                    resolve_images_folder(folder, data_root)
                except ValueError as exc:
                    problems.append(f"{where}: recipe {name!r} labels.{label}.{exc}")
        if recipe.judge is not None:
            problems.extend(f"{where}: recipe {name!r} judge.{p}"
                            for p in _judge_problems(recipe, data_root))
    if problems:
        raise RecipeError(path or Path("recipes"), list(dict.fromkeys(problems)))


def _judge_problems(recipe: Recipe, data_root: Path | None) -> list[str]:
    judge = recipe.judge
    assert judge is not None
    problems = []
    try:
        resolve_shots(judge.shots, recipe.label_names, data_root)
    except ValueError as exc:
        problems.append(str(exc))
    if judge.encoder != TINY_ENCODER:
        try:
            config = encoder_config(judge.encoder)
        except ValueError as exc:
            problems.append(str(exc))
        else:
            if judge.rule == "prompts" and not has_text_tower(config):
                problems.append(
                    f"rule: 'prompts' needs an encoder with a text tower; {judge.encoder!r} "
                    f"(model_type {config.get('model_type')!r}) is a vision model only: use "
                    "rule: shots, or a CLIP model folder")
    return problems


def long_prompts(
    recipes: Mapping[str, Recipe],
    count_tokens: Callable[[str], int],
    limit: int,
    *,
    path: Path | None = None,
) -> list[str]:
    """One line per distinct prompt or negative prompt of ``recipes`` longer than the text
    encoders' ``limit`` tokens (``count_tokens`` counts a text's tokens with the start and end
    tokens, as the model's tokenizer does): its token count, where it is, and the fix. The
    model reads only the first ``limit`` tokens of such a prompt. The service logs them once,
    when the model and the recipes are loaded (diffusers' per-batch warning is dropped)::

        long_prompts(recipes, lambda t: len(tokenizer(t).input_ids), 77)
    """
    where = str(path) if path is not None else "recipes"
    lines: dict[str, str] = {}
    for name, recipe in recipes.items():
        for label in recipe.label_names:
            spec = recipe.labels[label]
            texts = [(f"labels.{label}.prompts[{i}]", text)
                     for i, text in enumerate(spec.prompts)]
            if spec.negative_prompt:
                texts.append((f"labels.{label}.negative_prompt", spec.negative_prompt))
            for loc, text in texts:
                if text in lines:
                    continue
                tokens = count_tokens(text)
                if tokens > limit:
                    lines[text] = (
                        f"{where}: recipe {name!r} {loc} is {tokens} tokens, over the text "
                        f"encoders' {limit}: the model reads only its start "
                        f"({_short(text)}); shorten it to {limit} tokens or fewer")
    return list(lines.values())


class _RecipesFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    recipes: list[Recipe] = Field(min_length=1)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys (PyYAML silently keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.get(key)
            except TypeError:  # unhashable key: let PyYAML raise its own error
                break
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"duplicate key {key!r} (first at line {first.start_mark.line + 1}); "
                    "each key may appear once",
                    key_node.start_mark,
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]":
            out += " (the key itself)"
        elif part and set(part) <= LABEL_CHARS:
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out or "(top level)"


def _line_of(root: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """1-based line of the deepest node that ``loc`` reaches in the composed YAML tree."""
    node = root
    if node is None:
        return None
    line = node.start_mark.line + 1
    for part in loc:
        nxt: yaml.Node | None = None
        if isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if 0 <= part < len(node.value):
                nxt = node.value[part]
        elif isinstance(node, yaml.MappingNode) and isinstance(part, str):
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.value == part:
                    nxt = value_node
                    break
        if nxt is None:
            break
        node = nxt
        line = node.start_mark.line + 1
    return line


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _yaml_problem(path: Path, exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    problem = getattr(exc, "problem", None) or str(exc)
    return f"{where}: invalid YAML: {problem}"


def parse_recipes(text: str, *, path: Path, fmt: str | None = None) -> dict[str, Recipe]:
    """Parse recipes from ``text`` (``fmt`` "yaml" or "json"; default from ``path``'s suffix).

    ``path`` is only used for messages. Returns recipes by name, in file order.
    """
    fmt = fmt or ("json" if path.suffix.lower() == ".json" else "yaml")
    root: yaml.Node | None = None
    data: Any
    if fmt == "json":

        def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for key, value in items:
                if key in out:
                    raise ValueError(f"duplicate key {key!r}; each key may appear once")
                out[key] = value
            return out

        try:
            data = json.loads(text, object_pairs_hook=pairs)
        except json.JSONDecodeError as exc:
            raise RecipeError(
                path, [f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}"]
            ) from None
        except ValueError as exc:
            raise RecipeError(path, [f"{path}: invalid JSON: {exc}"]) from None
        try:  # JSON is (nearly) YAML: compose it only to map error locations to lines
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError:
            root = None
    elif fmt == "yaml":
        loader = _UniqueKeyLoader(text)
        try:
            root = loader.get_single_node()
            data = loader.construct_document(root) if root is not None else None
        except yaml.YAMLError as exc:
            raise RecipeError(path, [_yaml_problem(path, exc)]) from None
        finally:
            loader.dispose()
    else:
        raise ValueError(f"unknown recipes format {fmt!r}; use 'yaml' or 'json'")

    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise RecipeError(
            path,
            [
                f"{path}: (top level): the file is {kind}; it must be a mapping with a "
                "'recipes' key holding a list of recipes (see recipes/generic.yaml)"
            ],
        )
    try:
        parsed = _RecipesFile.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            loc = tuple(err["loc"])
            line = _line_of(root, loc)
            where = f"{path}:{line}" if line is not None else str(path)
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown key; remove it or check its spelling"
            elif err["type"] == "missing":
                msg = "required key is missing; add it"
            elif "input" in err and not isinstance(err["input"], dict | list):
                msg = f"{msg} (got {_short(err['input'])})"
            problems.append(f"{where}: {_format_loc(loc)}: {msg}")
        raise RecipeError(path, problems) from None

    recipes: dict[str, Recipe] = {}
    first_index: dict[str, int] = {}
    problems = []
    for i, recipe in enumerate(parsed.recipes):
        if recipe.name in recipes:
            line = _line_of(root, ("recipes", i, "name"))
            where = f"{path}:{line}" if line is not None else str(path)
            problems.append(
                f"{where}: recipes[{i}].name: duplicate recipe name {recipe.name!r} (also "
                f"recipes[{first_index[recipe.name]}].name); give each recipe its own name"
            )
            continue
        recipes[recipe.name] = recipe
        first_index[recipe.name] = i
    if problems:
        raise RecipeError(path, problems)
    return recipes


def load_recipes(path: Path) -> dict[str, Recipe]:
    """Load and validate a recipes file (``.yaml``, ``.yml`` or ``.json``).

    Example::

        recipes = load_recipes(Path("recipes/wound_phases.yaml"))
        recipes["wound-phases"].label_names   # ['I', 'P', 'R']

    Raises :class:`RecipeError` naming the file, line, location and fix on any problem.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in {".yaml", ".yml", ".json"}:
        raise RecipeError(
            path,
            [f"{path}: unsupported file type {suffix or '(none)'!r}; use .yaml, .yml or .json"],
        )
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(
            path, [f"{path}: file not found; check GENAUG_RECIPES (absolute path is safest)"]
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(path, [f"{path}: cannot read the file: {exc}"]) from None
    recipes = parse_recipes(text, path=path, fmt="json" if suffix == ".json" else "yaml")
    log.info("loaded %d recipe(s) from %s: %s", len(recipes), path, ", ".join(recipes))
    return recipes
