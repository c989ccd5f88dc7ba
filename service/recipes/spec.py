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
        scheduler: default    # optional: a name of genaug.service.batching.items.SCHEDULERS
        adapter: {name: wound-lora, scale: 0.8}   # optional: a LoRA of GENAUG_LORAS
        output_channels: 1    # optional: 1 (luminance, depth-like inputs) or 3 (RGB, default)
        labels:               # ordered: label i of the API is the i-th key here
          I:
            prompts: ["depth image of an inflamed diabetic foot ulcer"]
            negative_prompt: "text, watermark"
          P:
            prompts: ["depth image of a granulating diabetic foot ulcer"]
            adapter: {name: other-lora, scale: 1.0}   # per-label override
            images: wounds/P      # img2img variants of real images (DA-Fusion / Real Guidance):
            strength: 0.5         #   a folder under GENAUG_DATA_ROOT, never outside it;
            variants_per_image: 10  # the label's pool holds images x variants_per_image

Any mistake (unknown key, wrong type, bound exceeded, duplicate name or key, bad YAML) raises
:class:`RecipeError` whose message names the file, the line where known, the location inside
the file and what to change.

Pool identity: :func:`pool_id` combines the recipe name with a hash of its generation spec
(:meth:`Recipe.spec_hash`: everything that changes the images, not the description: the new
fields scheduler, adapter, output_channels, images, strength and variants_per_image enter it
only when set away from their defaults, so pools of older recipe files keep their identity),
the content of the label image folders (:func:`sources_digest`) and the model weights hash,
so editing a prompt or switching the model starts a new pool and never mixes
old images into it. :meth:`Recipe.plan` maps (label, k) to the k-th image's prompt and seed
deterministically, so a pool resumed after a restart continues where it stopped without
repeating a seed.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

import numpy as np
import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from ..batching.items import SCHEDULERS

__all__ = [
    "AdapterSpec",
    "LabelSpec",
    "PlanItem",
    "Recipe",
    "RecipeError",
    "SourceImage",
    "check_recipes",
    "load_label_sources",
    "load_recipes",
    "parse_recipes",
    "pool_id",
    "resolve_images_folder",
    "sources_digest",
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
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
MAX_VARIANTS_PER_IMAGE = 1000


class RecipeError(ValueError):
    """A recipes file could not be loaded; the message says where and how to fix it.

    ``path`` is the file; ``problems`` holds one line per problem, each
    ``"<file>[:line]: <location>: <what is wrong>"``.
    """

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        head = f"invalid recipes file {path}"
        if len(problems) == 1:  # one problem, one line (start-up errors print just this)
            super().__init__(f"invalid recipes file: {problems[0]}")
            return
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


def _check_scheduler(value: str) -> str:
    if value not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {value!r}; use one of {', '.join(SCHEDULERS)}")
    return value


def _check_folder(value: str) -> str:
    path = Path(value)
    if not value.strip() or path.is_absolute() or ".." in path.parts:
        raise ValueError(
            "images must be a folder relative to GENAUG_DATA_ROOT, without '..' "
            "(e.g. 'wounds/P')"
        )
    return value


RecipeName = Annotated[str, AfterValidator(_check_name)]
Scheduler = Annotated[str, AfterValidator(_check_scheduler)]
LabelName = Annotated[str, AfterValidator(_check_label)]
Prompt = Annotated[str, Field(max_length=MAX_PROMPT_CHARS), AfterValidator(_check_prompt)]


class PlanItem(NamedTuple):
    """What to generate for one image of a label: prompt, negative prompt and seed."""

    prompt: str
    negative_prompt: str | None
    seed: int


class AdapterSpec(BaseModel):
    """A LoRA adapter (a name of ``GENAUG_LORAS``) and the scale it is applied at.

    Example::

        AdapterSpec(name="wound-lora", scale=0.8)
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: Annotated[str, Field(min_length=1, max_length=64)]
    scale: float = Field(default=1.0, ge=-4.0, le=4.0, allow_inf_nan=False)


class LabelSpec(BaseModel):
    """How to prompt for one label; optionally img2img variants of real images.

    ``images`` is a folder under ``GENAUG_DATA_ROOT`` holding the label's real images
    (png, jpg, bmp, webp); the label's pool then holds ``variants_per_image`` img2img
    variants of each (DA-Fusion uses 10) at ``strength``. ``adapter`` overrides the
    recipe's. Example::

        LabelSpec(prompts=["a red circle", "a small red disc"], negative_prompt="text")
        LabelSpec(prompts=["a photo of a wound"], images="wounds/P", strength=0.5,
                  variants_per_image=10)
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    prompts: list[Prompt] = Field(min_length=1, max_length=MAX_PROMPTS_PER_LABEL)
    negative_prompt: Annotated[str, Field(max_length=MAX_PROMPT_CHARS)] | None = None
    adapter: AdapterSpec | None = None
    images: Annotated[str, Field(max_length=500), AfterValidator(_check_folder)] | None = None
    strength: float = Field(default=0.5, gt=0.0, le=1.0, allow_inf_nan=False)
    variants_per_image: int = Field(default=10, ge=1, le=MAX_VARIANTS_PER_IMAGE)

    def spec(self) -> dict[str, Any]:
        """This label's part of :meth:`Recipe.spec` (new fields only when set)."""
        out: dict[str, Any] = {"prompts": list(self.prompts),
                               "negative_prompt": self.negative_prompt}
        if self.adapter is not None:
            out["adapter"] = self.adapter.model_dump()
        if self.images is not None:
            out["images"] = self.images
            out["strength"] = self.strength
            out["variants_per_image"] = self.variants_per_image
        return out


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
    scheduler: Scheduler = "default"
    adapter: AdapterSpec | None = None
    output_channels: Literal[1, 3] = 3

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

    def adapter_for(self, label: str) -> AdapterSpec | None:
        """The adapter ``label`` is generated with: its own, else the recipe's."""
        own = self.labels[label].adapter
        return own if own is not None else self.adapter

    @property
    def output_size(self) -> tuple[int, int]:
        """(height, width) of the images the pool stores and serves."""
        if self.output_height is not None and self.output_width is not None:
            return self.output_height, self.output_width
        return self.height, self.width

    def spec(self) -> dict[str, Any]:
        """The generation spec: everything that changes the images (not name or description)."""
        spec: dict[str, Any] = {
            "spec_version": SPEC_VERSION,
            "labels": {label: s.spec() for label, s in self.labels.items()},
            "height": self.height,
            "width": self.width,
            "output_height": self.output_height,
            "output_width": self.output_width,
            "steps": self.steps,
            "guidance": self.guidance,
            "base_seed": self.base_seed,
        }
        # Added fields enter the spec only away from their defaults: a recipe that does not
        # use them keeps the pool identity it had before they existed.
        if self.scheduler != "default":
            spec["scheduler"] = self.scheduler
        if self.adapter is not None:
            spec["adapter"] = self.adapter.model_dump()
        if self.output_channels != 3:
            spec["output_channels"] = self.output_channels
        return spec

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


def pool_id(recipe: Recipe, model_hash: str, *, sources: str | None = None) -> str:
    """Identity of a recipe's pool under one model: ``"<name>-<12 hex>"``.

    The hex part hashes the recipe's :meth:`Recipe.spec_hash` with the model weights hash (and
    ``sources``, the :func:`sources_digest` of its label image folders, when it has any), so a
    changed prompt, size, seed, source image or model gives a new, empty pool.
    """
    if not model_hash:
        raise ValueError("model_hash is empty; pass the loaded model's weights_hash")
    key = f"{recipe.spec_hash()}:{model_hash}" + (f":{sources}" if sources else "")
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f"{recipe.name}-{digest[:12]}"


# -- real images for img2img variants -------------------------------------------------------


@dataclass(frozen=True)
class SourceImage:
    """One real image of a label: its file name, its pixels at the recipe's generation size
    (uint8 [height, width, 3]) and its hash (blake2b-16 of the pixels and shape, hex)."""

    name: str
    pixels: np.ndarray
    hash: str


def source_hash(pixels: np.ndarray) -> str:
    """blake2b-16 (hex) of an image's bytes and shape: the ``source`` a variant remembers."""
    h = hashlib.blake2b(digest_size=16)
    h.update(np.ascontiguousarray(pixels).tobytes())
    h.update(repr(tuple(pixels.shape)).encode())
    return h.hexdigest()


def resolve_images_folder(folder: str, data_root: Path | None) -> Path:
    """``data_root / folder``, refusing anything that resolves outside ``data_root``
    (``..``, absolute paths, symlinks out). Raises ``ValueError`` saying what to fix."""
    if data_root is None:
        raise ValueError(
            f"images: {folder!r} needs GENAUG_DATA_ROOT, the folder that label image folders "
            "are read from; set it (e.g. GENAUG_DATA_ROOT=/data/real)"
        )
    root = Path(data_root).resolve()
    path = (root / folder).resolve()
    if Path(folder).is_absolute() or not path.is_relative_to(root):
        raise ValueError(f"images: {folder!r} resolves to {path}, outside GENAUG_DATA_ROOT "
                         f"{root}; keep label folders inside it")
    if not path.is_dir():
        raise ValueError(f"images: {folder!r}: {path} is not a folder under GENAUG_DATA_ROOT "
                         f"{root}; create it or fix the name")
    files = _image_files(path, root)
    if not files:
        raise ValueError(f"images: {folder!r}: {path} holds no image "
                         f"({', '.join(IMAGE_SUFFIXES)}); add the label's real images")
    return path


def _image_files(path: Path, root: Path) -> list[Path]:
    return sorted(
        f for f in path.iterdir()
        if f.suffix.lower() in IMAGE_SUFFIXES and f.is_file() and f.resolve().is_relative_to(root)
    )


def load_label_sources(recipe: Recipe, label: str, data_root: Path | None) -> list[SourceImage]:
    """The label's real images, RGB at the recipe's generation size, sorted by file name;
    [] for a text-to-image label. Raises ``ValueError`` for a folder that cannot be used."""
    from PIL import Image

    folder = recipe.labels[label].images
    if folder is None:
        return []
    path = resolve_images_folder(folder, data_root)
    out = []
    for file in _image_files(path, Path(data_root or ".").resolve()):
        try:
            with Image.open(file) as img:
                rgb = img.convert("RGB")
                if rgb.size != (recipe.width, recipe.height):
                    rgb = rgb.resize((recipe.width, recipe.height), Image.Resampling.LANCZOS)
                pixels = np.asarray(rgb, dtype=np.uint8).copy()
        except OSError as exc:
            raise ValueError(f"images: {folder!r}: {file.name} is not a readable image "
                             f"({exc}); remove or replace it") from None
        out.append(SourceImage(file.name, pixels, source_hash(pixels)))
    return out


def sources_digest(sources: Mapping[str, list[SourceImage]]) -> str | None:
    """One hash over every label's source images (None when there are none): part of the
    pool identity, so editing a label's folder starts a new pool."""
    if not any(sources.values()):
        return None
    h = hashlib.sha256()
    for label in sorted(sources):
        for image in sources[label]:
            h.update(f"{label}\x00{image.name}\x00{image.hash}\n".encode())
    return h.hexdigest()


def check_recipes(
    recipes: Mapping[str, Recipe],
    *,
    adapters: Collection[str] = (),
    data_root: Path | None = None,
    path: Path | None = None,
) -> None:
    """Start-up checks that need the running configuration: every adapter a recipe names is
    loaded (``adapters``: the names of ``GENAUG_LORAS``), and every label image folder exists
    under ``data_root`` and holds images. Schedulers are checked when the file is parsed.

    Raises :class:`RecipeError`, one line per problem (the service exits 2 with it)::

        check_recipes(recipes, adapters={"wound-lora"}, data_root=Path("/data/real"))
    """
    problems = []
    where = str(path) if path is not None else "recipes"
    known = ", ".join(sorted(adapters)) or "none (set GENAUG_LORAS=name=path)"
    for name, recipe in recipes.items():
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
    if problems:
        raise RecipeError(path or Path("recipes"), list(dict.fromkeys(problems)))


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
