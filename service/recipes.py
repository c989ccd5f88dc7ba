"""Recipes: how to make images for a labelled dataset, loaded from one YAML or JSON file.

A recipe names a set of labels, each with one or more prompt templates (cycled, so the images
of a label vary) and an optional negative prompt, plus the generation spec shared by all its
images: generation size, optional output size, steps, guidance and a base seed.

File format (``GENAUG_RECIPES``; ``.yaml``/``.yml`` or ``.json``): one top-level key
``recipes`` holding a **list** of recipes, each with a unique ``name``. A list (rather than a
mapping name -> spec) keeps the name inside the object it names, so error locations read
``recipes[1].labels.P.prompts[0]`` and a recipe can be copied between files whole::

    recipes:
      - name: wound-phases
        description: Diabetic foot ulcer healing phases, depth images.
        height: 64            # generation size (multiple of 8)
        width: 64
        output_height: 64     # optional: resize generated images to this size
        output_width: 64
        steps: 4
        guidance: 5.0
        base_seed: 0
        labels:               # ordered: label i of the API is the i-th key here
          I:
            prompts: ["depth image of an inflamed diabetic foot ulcer"]
            negative_prompt: "text, watermark"

Any mistake (unknown key, wrong type, bound exceeded, duplicate name or key, bad YAML) raises
:class:`RecipeError` whose message names the file, the line where known, the location inside
the file and what to change.

Pool identity: :func:`pool_id` combines the recipe name with a hash of its generation spec
(:meth:`Recipe.spec_hash`: everything that changes the images, not the description) and the
model weights hash, so editing a prompt or switching the model starts a new pool and never mixes
old images into it. :meth:`Recipe.plan` maps (label, k) to the k-th image's prompt and seed
deterministically, so a pool resumed after a restart continues where it stopped without
repeating a seed.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

__all__ = [
    "LabelSpec",
    "PlanItem",
    "Recipe",
    "RecipeError",
    "load_recipes",
    "parse_recipes",
    "pool_id",
]

log = logging.getLogger(__name__)

#: Bumped whenever the meaning of a spec or of :meth:`Recipe.plan` changes, so pools made
#: under the old meaning are never continued under the new one.
SPEC_VERSION = 1
MAX_PROMPT_CHARS = 1000
MAX_LABELS = 1000
MAX_PROMPTS_PER_LABEL = 1000
_INT63 = (1 << 63) - 1
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")
_LABEL_CHARS = _NAME_CHARS | frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ.")


class RecipeError(ValueError):
    """A recipes file could not be loaded; the message says where and how to fix it.

    ``path`` is the file; ``problems`` holds one line per problem, each
    ``"<file>[:line]: <location>: <what is wrong>"``.
    """

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        head = f"invalid recipes file {path}"
        body = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"{head}:\n{body}" if body else head)


def _check_name(value: str) -> str:
    if not (1 <= len(value) <= 64) or not set(value) <= _NAME_CHARS or value[0] in "-_":
        raise ValueError(
            "recipe name must be 1-64 characters of a-z, 0-9, '-' or '_', starting with a "
            "letter or digit (e.g. 'wound-phases')"
        )
    return value


def _check_label(value: str) -> str:
    if not (1 <= len(value) <= 64) or not set(value) <= _LABEL_CHARS or value[0] in "-_.":
        raise ValueError(
            "label must be 1-64 characters of A-Z, a-z, 0-9, '-', '_' or '.', starting with a "
            "letter or digit (e.g. 'P' or 'healthy_skin')"
        )
    return value


def _check_prompt(value: str) -> str:
    if not value.strip():
        raise ValueError("prompt is empty or only whitespace; write the text to generate from")
    return value


RecipeName = Annotated[str, AfterValidator(_check_name)]
LabelName = Annotated[str, AfterValidator(_check_label)]
Prompt = Annotated[str, Field(max_length=MAX_PROMPT_CHARS), AfterValidator(_check_prompt)]


class PlanItem(NamedTuple):
    """What to generate for one image of a label: prompt, negative prompt and seed."""

    prompt: str
    negative_prompt: str | None
    seed: int


class LabelSpec(BaseModel):
    """How to prompt for one label.

    Example::

        LabelSpec(prompts=["a red circle", "a small red disc"], negative_prompt="text")
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    prompts: list[Prompt] = Field(min_length=1, max_length=MAX_PROMPTS_PER_LABEL)
    negative_prompt: Annotated[str, Field(max_length=MAX_PROMPT_CHARS)] | None = None


class Recipe(BaseModel):
    """A named, labelled generation spec; validated with explicit bounds.

    Example::

        recipe = Recipe(
            name="shapes",
            labels={"circle": LabelSpec(prompts=["a circle"]),
                    "square": LabelSpec(prompts=["a square"])},
            height=64, width=64, steps=4, guidance=5.0,
        )
        recipe.label_names                  # ['circle', 'square']
        prompt, negative, seed = recipe.plan("square", 0)
        pool_id(recipe, model_hash="0123abcd")   # 'shapes-<12 hex>'
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: RecipeName
    description: Annotated[str, Field(max_length=4000)] = ""
    labels: dict[LabelName, LabelSpec] = Field(min_length=1, max_length=MAX_LABELS)
    height: int = Field(ge=8, le=4096, multiple_of=8)
    width: int = Field(ge=8, le=4096, multiple_of=8)
    output_height: int | None = Field(default=None, ge=1, le=4096)
    output_width: int | None = Field(default=None, ge=1, le=4096)
    steps: int = Field(ge=1, le=200)
    guidance: float = Field(ge=0.0, le=30.0, allow_inf_nan=False)
    base_seed: int = Field(default=0, ge=0, le=_INT63)

    @model_validator(mode="after")
    def _output_size_pair(self) -> Recipe:
        if (self.output_height is None) != (self.output_width is None):
            raise ValueError(
                "output_height and output_width go together: set both (to resize generated "
                "images) or neither (to keep the generation size)"
            )
        return self

    @property
    def label_names(self) -> list[str]:
        """Labels in file order; the API's int32 label ``i`` is ``label_names[i]``."""
        return list(self.labels)

    def label_index(self, label: str) -> int:
        """Index of ``label`` in :attr:`label_names`; ``KeyError`` naming the choices."""
        try:
            return self.label_names.index(label)
        except ValueError:
            raise KeyError(
                f"recipe {self.name!r} has no label {label!r}; labels: {self.label_names}"
            ) from None

    @property
    def output_size(self) -> tuple[int, int]:
        """(height, width) of the images the pool stores and serves."""
        if self.output_height is not None and self.output_width is not None:
            return self.output_height, self.output_width
        return self.height, self.width

    def spec(self) -> dict[str, Any]:
        """The generation spec: everything that changes the images (not name or description)."""
        return {
            "spec_version": SPEC_VERSION,
            "labels": {
                label: {"prompts": list(s.prompts), "negative_prompt": s.negative_prompt}
                for label, s in self.labels.items()
            },
            "height": self.height,
            "width": self.width,
            "output_height": self.output_height,
            "output_width": self.output_width,
            "steps": self.steps,
            "guidance": self.guidance,
            "base_seed": self.base_seed,
        }

    def spec_hash(self) -> str:
        """SHA-256 hex of the canonical JSON of :meth:`spec`; stable across runs and machines."""
        canonical = json.dumps(
            self.spec(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def plan(self, label: str, index: int) -> PlanItem:
        """Prompt, negative prompt and seed of the ``index``-th image ever made for ``label``.

        Prompts cycle through the label's templates (image k uses template k mod len), so every
        template is used equally. The seed is a BLAKE2b hash of (base_seed, label, index) cut
        to 63 bits: deterministic, distinct across labels and indices (collisions have
        probability ~n²/2⁶⁴), so a pool that resumes at its stored ``next_index`` never repeats
        an image.
        """
        spec = self.labels.get(label)
        if spec is None:
            raise KeyError(
                f"recipe {self.name!r} has no label {label!r}; labels: {self.label_names}"
            )
        if index < 0:
            raise ValueError(f"plan index must be >= 0, got {index}")
        prompt = spec.prompts[index % len(spec.prompts)]
        return PlanItem(prompt, spec.negative_prompt, _plan_seed(self.base_seed, label, index))

    def plan_batch(self, label: str, start: int, n: int) -> list[PlanItem]:
        """:meth:`plan` for indices ``start .. start+n-1``."""
        return [self.plan(label, start + k) for k in range(n)]


def _plan_seed(base_seed: int, label: str, index: int) -> int:
    key = f"genaug-seed-v{SPEC_VERSION}\x00{base_seed}\x00{label}\x00{index}".encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "big") & _INT63


def pool_id(recipe: Recipe, model_hash: str) -> str:
    """Identity of a recipe's pool under one model: ``"<name>-<12 hex>"``.

    The hex part hashes the recipe's :meth:`Recipe.spec_hash` with the model weights hash, so
    a changed prompt, size, seed or model gives a new, empty pool.
    """
    if not model_hash:
        raise ValueError("model_hash is empty; pass the loaded model's weights_hash")
    digest = hashlib.sha256(f"{recipe.spec_hash()}:{model_hash}".encode()).hexdigest()
    return f"{recipe.name}-{digest[:12]}"


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
        elif part and set(part) <= _LABEL_CHARS:
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
