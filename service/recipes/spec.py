"""Recipes: how to make images for a labelled dataset (the models, their checks, the plan).

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
        speed: quality        # optional: quality (the sampler above), turbo (the model's
                              #   few-step setting) or auto (with a judge: the cheapest
                              #   sampler the judge accepts, decided per pool)
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
        judge:                # optional: score every pool image against real images
          shots: wounds/shots # a folder under GENAUG_DATA_ROOT, one subfolder per label
          encoder: /models/clip-vit-b32   # or tiny-digits-encoder (the tiny models' default)
          rule: shots         # shots (a classifier on the shots) or prompts (zero-shot)
          min_score: 0.9      # images scored below it are kept, counted, never sampled

Any mistake (unknown key, wrong type, bound exceeded, duplicate name or key, bad YAML) raises
:class:`RecipeError` whose message names the file, the line where known, the location inside
the file and what to change. Files are read by :mod:`genaug.service.recipes.load`; a label's
real images by :mod:`genaug.service.recipes.sources`.

The judge (:class:`JudgeSpec`, used by :mod:`genaug.service.judge`) does not enter the pool
identity: it changes which images are sampled, never what is generated, so adding, removing or
changing a judge keeps the pool and its images (each keeps the score it was stored with).

Pool identity: :func:`pool_id` combines the recipe name with a hash of its generation spec
(:meth:`Recipe.spec_hash`: everything that changes the images, not the description: the new
fields scheduler, adapter, output_channels, images, strength and variants_per_image enter it
only when set away from their defaults, so pools of older recipe files keep their identity),
the content of the label image folders
(:func:`~genaug.service.recipes.sources.sources_digest`) and the model weights hash,
so editing a prompt or switching the model starts a new pool and never mixes
old images into it. :meth:`Recipe.plan` maps (label, k) to the k-th image's prompt and seed
deterministically, so a pool resumed after a restart continues where it stopped without
repeating a seed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from ..batching.items import SCHEDULERS
from ..sampling.modes import RecipeSpeed

__all__ = [
    "LABEL_CHARS",
    "AdapterSpec",
    "JudgeSpec",
    "LabelSpec",
    "PlanItem",
    "Recipe",
    "RecipeError",
    "pool_id",
]

#: Bumped whenever the meaning of a spec or of :meth:`Recipe.plan` changes, so pools made
#: under the old meaning are never continued under the new one.
SPEC_VERSION = 1
MAX_PROMPT_CHARS = 1000
MAX_LABELS = 1000
MAX_PROMPTS_PER_LABEL = 1000
MAX_VARIANTS_PER_IMAGE = 1000
_INT63 = (1 << 63) - 1
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")
#: The characters of a label name (error locations print such keys as ``.P``, not ``['P']``).
LABEL_CHARS = _NAME_CHARS | frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ.")


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


def _check_identifier(value: str, chars: frozenset[str], what: str, spelled: str,
                      example: str) -> str:
    """``value`` if it is 1-64 of ``chars`` and starts with a letter or digit (``chars``'
    others are punctuation), else the one-line error saying so."""
    if not (1 <= len(value) <= 64) or not set(value) <= chars or not value[0].isalnum():
        raise ValueError(f"{what} must be 1-64 characters of {spelled}, starting with a "
                         f"letter or digit (e.g. {example})")
    return value


def _check_name(value: str) -> str:
    return _check_identifier(value, _NAME_CHARS, "recipe name", "a-z, 0-9, '-' or '_'",
                             "'wound-phases'")


def _check_label(value: str) -> str:
    return _check_identifier(value, LABEL_CHARS, "label", "A-Z, a-z, 0-9, '-', '_' or '.'",
                             "'P' or 'healthy_skin'")


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


#: The embedded encoder of the tiny models (``judge.encoder``); anything else is a folder.
TINY_ENCODER = "tiny-digits-encoder"
JUDGE_RULES = ("shots", "prompts")


def _check_shots(value: str) -> str:
    path = Path(value)
    if not value.strip() or path.is_absolute() or ".." in path.parts:
        raise ValueError(
            f"shots {value!r} must be a folder relative to GENAUG_DATA_ROOT, without '..', "
            "holding one subfolder of real images per label (e.g. 'digits/shots')"
        )
    return value


def _check_encoder(value: str) -> str:
    if not value.strip():
        raise ValueError(
            f"encoder is empty; use {TINY_ENCODER!r} (the tiny models' embedded encoder) or "
            "the path of a local transformers model folder (a CLIP model, or a vision model "
            "with pooled embeddings)"
        )
    return value


def _check_min_score(value: float) -> float:
    if not 0.0 <= value <= 1.0 or value != value:
        raise ValueError(
            f"min_score {value!r} is outside 0..1: it is the least probability the judge "
            "gives an image of showing its label; use a value between 0 and 1 (e.g. 0.8)"
        )
    return value


def _check_rule(value: str) -> str:
    if value not in JUDGE_RULES:
        raise ValueError(
            f"rule {value!r} is unknown; use 'shots' (a classifier fitted on the shots' "
            "embeddings) or 'prompts' (zero-shot agreement with the labels' prompts, for an "
            "encoder with a text tower)"
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


class JudgeSpec(BaseModel):
    """How every image a recipe's pool stores is judged against the user's own images.

    ``shots`` is a folder under ``GENAUG_DATA_ROOT`` with one subfolder of real images per
    label (the layout ``genaug adapt`` reads); ``encoder`` is ``tiny-digits-encoder`` (the
    tiny models' embedded default) or a local transformers model folder (a CLIP model, or any
    vision model with pooled embeddings; loaded offline); ``rule`` is ``shots`` (a logistic
    regression fitted on the shots' embeddings, with augmented views) or ``prompts`` (zero-shot
    agreement with the labels' prompts; needs an encoder with a text tower). An image's score
    is the probability the rule gives its label; images below ``min_score`` are kept and
    counted but never sampled (the default 0.9 was measured on the adapted digits of
    docs/benchmarks.md: 96-98 % of the images it keeps show their label, and it keeps 86-90 %
    of the right ones). Example::

        JudgeSpec(shots="digits/shots", encoder="tiny-digits-encoder", min_score=0.9)
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    shots: Annotated[str, Field(max_length=500), AfterValidator(_check_shots)]
    encoder: Annotated[str, Field(max_length=1000), AfterValidator(_check_encoder)] = (
        TINY_ENCODER)
    rule: Annotated[str, AfterValidator(_check_rule)] = "shots"
    min_score: Annotated[float, Field(allow_inf_nan=False),
                         AfterValidator(_check_min_score)] = 0.9

    @model_validator(mode="after")
    def _prompts_need_text(self) -> JudgeSpec:
        if self.rule == "prompts" and self.encoder == TINY_ENCODER:
            raise ValueError(
                f"rule 'prompts' needs an encoder with a text tower, and {TINY_ENCODER!r} has "
                "none; use rule: shots, or name a CLIP model folder as encoder"
            )
        return self


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
    judge: JudgeSpec | None = None
    speed: RecipeSpeed = "quality"

    @model_validator(mode="after")
    def _judge_needs_labels(self) -> Recipe:
        if self.judge is not None and self.judge.rule == "shots" and len(self.labels) < 2:
            raise ValueError(
                f"judge rule 'shots' needs at least 2 labels to tell apart (the recipe has "
                f"{len(self.labels)}); add labels, or use rule: prompts with a CLIP encoder"
            )
        return self

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
        # turbo and auto pools hold other images than the quality pool; auto's decision is a
        # fact of the pool (its database), not of the spec.
        if self.speed != "quality":
            spec["speed"] = self.speed
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
