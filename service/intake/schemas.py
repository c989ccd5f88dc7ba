"""Request bodies of the HTTP API: pydantic, ``extra="forbid"``, explicit bounds.

The request models are built per app by :func:`build_api_models` from the running
configuration, so the schema served at ``/openapi.json`` and the validation are one thing:
operator limits (``GENAUG_MAX_SIDE`` ...) are the maxima, recipe labels and adapter names are
enums, and a bound that involves two fields is folded into one field's bound (``seed`` stops
``max_n - 1`` below the largest seed, so ``seed + n - 1`` always fits). What the schema admits,
the service accepts; the few dynamic answers no schema can express (a full queue, a deadline,
a model still loading) are listed in docs/reliability.md. The answers' models are the HTTP
edge's (``api/responses.py``).

JSON numbers: an integer field accepts an integral number (``4.0``), as JSON Schema's
``integer`` does, and a number field accepts an integer; strings and booleans are refused.

Example::

    models = build_api_models(Settings(max_n=8), recipes={}, adapters=(),
                              defaults=(64, 4, 5.0))
    body = models.generate.model_validate_json(b'{"prompt": "a wound", "n": 4}')
    body.n   # 4
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator
from pydantic_core import PydanticCustomError

from ..batching.items import SCHEDULERS
from ..settings import Settings

if TYPE_CHECKING:
    from ..recipes.spec import Recipe

Priority = Literal["interactive", "bulk"]
SEED_MAX = 2**63 - 1
#: The shortest ``timeout_s`` a request may set: a shorter deadline could never be met.
MIN_TIMEOUT_S = 0.5
MAX_GUIDANCE = 50.0
MAX_ADAPTER_SCALE = 4.0
#: The largest need one label may be given (only proportions count; this bounds the numbers).
MAX_NEED = 1e6
# A prompt needs one non-space character. The space characters are listed, not written
# ``\S``: Python's ``\s`` (which validates) and JSON Schema's ECMA ``\s`` (which clients and
# fuzzers read) differ on \x1c-\x1f and \ufeff; listing the union makes both read the same.
_NON_BLANK = (r"[^\x09-\x0d\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f"
              r"\u205f\u3000\ufeff]")


def _numeric_kind(annotation: Any) -> str | None:
    """``"int"`` or ``"float"`` for a (possibly optional) numeric field annotation."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _numeric_kind(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        kinds = {_numeric_kind(a) for a in typing.get_args(annotation)} - {None}
        return kinds.pop() if len(kinds) == 1 else None
    if annotation is int:
        return "int"
    if annotation is float:
        return "float"
    return None


@functools.cache
def _numeric_fields(cls: type[BaseModel]) -> tuple[frozenset[str], frozenset[str]]:
    ints, floats = set(), set()
    for name, info in cls.model_fields.items():
        kind = _numeric_kind(info.annotation)
        if kind == "int":
            ints.add(name)
        elif kind == "float":
            floats.add(name)
    return frozenset(ints), frozenset(floats)


class Body(BaseModel):
    """Base of every request body: strict types, unknown fields refused, JSON numbers as
    JSON Schema reads them (an integral ``4.0`` is an integer, ``4`` is a number)."""

    model_config = ConfigDict(extra="forbid", strict=True, regex_engine="python-re")

    @model_validator(mode="before")
    @classmethod
    def _json_numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        ints, floats = _numeric_fields(cls)
        out = dict(data)
        for name in ints & out.keys():
            value = out[name]
            if isinstance(value, float) and value.is_integer():
                out[name] = int(value)
        for name in floats & out.keys():
            value = out[name]
            if isinstance(value, int) and not isinstance(value, bool):
                out[name] = float(value)
        return out


class GenerationFields(Body):
    """The fields generate and the variants' params share: what to draw, at which output
    size, with which steps, guidance, seed, scheduler and adapter, how urgent and for how long.

    The base of :class:`GenerateRequest` and :class:`VariantParams`; the configured bounds of
    these fields are set once for both by :func:`build_api_models`. Example::

        body = GenerateRequest(prompt="a red circle", n=2)
        isinstance(body, GenerationFields), body.priority   # True, 'interactive'
    """

    prompt: str
    negative_prompt: str | None = None
    output_height: int | None = None
    output_width: int | None = None
    steps: int | None = None
    guidance: float | None = None
    seed: int | None = None
    priority: Priority = "interactive"
    timeout_s: float | None = None
    scheduler: str | None = None
    adapter: str | None = None
    adapter_scale: float | None = None


class GenerateRequest(GenerationFields):
    """``POST /v1/generate``. Omitted size, steps and guidance take the service defaults.

    Example body::

        {"prompt": "depth image of a healing wound", "n": 4, "height": 64, "width": 64,
         "seed": 7}

    Image ``i`` uses seed ``seed + i`` (or a drawn seed); the seeds always come back. With one
    of ``output_height``/``output_width`` the other keeps the generated aspect ratio.
    """

    n: int = 1
    height: int | None = None
    width: int | None = None


class VariantParams(GenerationFields):
    """The ``params`` part of ``POST /v1/variants`` (multipart): how to vary the sources.

    Example part::

        {"prompt": "a handwritten three", "strength": 0.5, "n_per_image": 4, "seed": 1}

    Variant ``k`` of source ``j`` uses seed ``seed + j * n_per_image + k``.
    """

    strength: float = 0.5
    n_per_image: int = 1


class SampleRequest(Body):
    """``POST /v1/recipes/{name}/sample``: images from the recipe's pool.

    Example body::

        {"labels": ["I", "P"], "n": 64, "wait_s": 2.0}
    """

    labels: str | list[str] | None = None
    n: int = 64
    wait_s: float = 0.0


def _one_of_fill(schema: dict[str, Any]) -> None:
    """The fill body's schema says what its validator checks: exactly one of the two fields
    (neither takes null; leaving one out is how it is not given)."""
    for field in ("per_label", "images"):
        schema.get("properties", {}).get(field, {}).pop("default", None)
    schema["oneOf"] = [{"required": ["per_label"]}, {"required": ["images"]}]


class FillRequest(Body):
    """``POST /v1/recipes/{name}/fill``: fill each label to at least ``per_label`` images, or
    generate ``images`` more, split over the labels by the trainers' need and recent demand.

    Exactly one of the two. Example bodies::

        {"per_label": 500}
        {"images": 2000}
    """

    model_config = ConfigDict(json_schema_extra=_one_of_fill)

    per_label: int | None = None
    images: int | None = None

    @model_validator(mode="after")
    def _one_amount(self) -> FillRequest:
        if (self.per_label is None) != (self.images is None):
            return self
        fix = ("send per_label (fill every label to that many images) or images (that many "
               "more, split over the labels by need)")
        if self.per_label is None:
            raise PydanticCustomError("fill_amount", "per_label or images is required; " + fix,
                                      {"field": "per_label"})
        raise PydanticCustomError(
            "fill_amount", f"images = {self.images} and per_label = {self.per_label}: give "
            "one of them, not both; " + fix, {"field": "images"})


class FeedbackRequest(Body):
    """``POST /v1/recipes/{name}/feedback``: what this client needs, per label.

    Example body::

        {"need": {"3": 0.4, "8": 0.9}}

    Values are any numbers from 0 to 1e6; only their proportions count (the service
    normalises each client's report). Labels left out need nothing; ``{}`` withdraws the
    client's need. A report replaces the client's previous one and decays when not renewed
    (``GENAUG_NEED_HALF_LIFE_S``).
    """

    need: dict[str, float]


@dataclass(frozen=True)
class ApiModels:
    """The request models of one app, bounded by its settings, recipes and adapters.

    ``sample``, ``fill`` and ``feedback`` hold one model per recipe (its labels are an
    enum); ``hints`` the
    fix a 422 names, per route and field; ``defaults`` the (size, steps, guidance) that
    omitted fields take.
    """

    generate: type[GenerateRequest]
    variants: type[VariantParams]
    sample: Mapping[str, type[SampleRequest]]
    fill: Mapping[str, type[FillRequest]]
    feedback: Mapping[str, type[FeedbackRequest]]
    hints: Mapping[str, Mapping[str, str]]
    defaults: tuple[int, int, float]
    adapters: tuple[str, ...]
    max_side: int


def _choice(names: Sequence[str]) -> Any:
    return Literal[tuple(names)]  # a Literal of runtime values: an enum in the schema


def _generation_fields(
    s: Settings, adapters: Sequence[str], schedulers: Sequence[str], *, max_images: int
) -> dict[str, Any]:
    """The :class:`GenerationFields` of generate and the variants' params, with their
    configured bounds."""
    side = s.max_side - s.max_side % 8
    fields: dict[str, Any] = {
        "prompt": (str, Field(min_length=1, max_length=s.max_prompt_chars, pattern=_NON_BLANK,
                              description="What to draw.")),
        "negative_prompt": (str | None, Field(default=None, max_length=s.max_prompt_chars,
                                              description="What to avoid.")),
        "output_height": (int | None, Field(default=None, ge=1, le=s.max_side,
                                            description="Resize the output to this height.")),
        "output_width": (int | None, Field(default=None, ge=1, le=s.max_side,
                                           description="Resize the output to this width.")),
        "steps": (int | None, Field(default=None, ge=1, le=s.max_steps,
                                    description="Denoising steps.")),
        "guidance": (float | None, Field(default=None, ge=0, le=MAX_GUIDANCE,
                                         allow_inf_nan=False,
                                         description="Classifier-free guidance scale.")),
        "seed": (int | None, Field(default=None, ge=0, le=SEED_MAX - (max_images - 1),
                                   description="Seed of the first image; image i uses seed + i.")),
        "timeout_s": (float | None, Field(default=None, ge=MIN_TIMEOUT_S, le=s.max_timeout_s,
                                          allow_inf_nan=False,
                                          description="Deadline; past it the answer is 504.")),
        "scheduler": (_choice(schedulers) | None, Field(
            default=None, description="Sampler; default: the service's (GENAUG_SCHEDULER).")),
    }
    if side < 8:
        raise ValueError(f"max_side {s.max_side} leaves no multiple of 8 to generate at")
    if adapters:
        fields["adapter"] = (_choice(adapters) | None, Field(
            default=None, description="LoRA adapter (GENAUG_LORAS)."))
        fields["adapter_scale"] = (float | None, Field(
            default=None, ge=0, le=MAX_ADAPTER_SCALE, allow_inf_nan=False,
            description="Adapter strength (default 1.0)."))
    else:  # no adapters configured: the fields exist but admit only null
        fields["adapter"] = (None, Field(default=None, description="No GENAUG_LORAS set."))
        fields["adapter_scale"] = (None, Field(default=None, description="No adapters."))
    return fields


def _hints(s: Settings, capacity: int) -> dict[str, dict[str, str]]:
    side = (f"use a multiple of 8 from 8 to max_side {s.max_side}, or set GENAUG_MAX_SIDE")
    out_side = f"use 1 to max_side {s.max_side}, or set GENAUG_MAX_SIDE"
    common = {
        "prompt": f"send 1 to max_prompt_chars {s.max_prompt_chars} characters with some "
                  "non-space text, or set GENAUG_MAX_PROMPT_CHARS",
        "negative_prompt": f"send at most max_prompt_chars {s.max_prompt_chars} characters "
                           "or leave it out",
        "height": side,
        "width": side,
        "output_height": out_side,
        "output_width": out_side,
        "steps": f"use 1 to max_steps {s.max_steps}, or set GENAUG_MAX_STEPS",
        "guidance": f"use a number from 0 to {MAX_GUIDANCE:g}",
        "seed": "use an integer from 0 up to the schema's maximum (the largest seed less the "
                "images of one request), or leave it out for random seeds",
        "priority": "use 'interactive' or 'bulk'",
        "timeout_s": f"use {MIN_TIMEOUT_S:g} to max_timeout_s {s.max_timeout_s:g} seconds, or "
                     "set GENAUG_MAX_TIMEOUT_S",
        "scheduler": f"use one of {', '.join(SCHEDULERS)}",
        "adapter": "use one of the adapters GET /v1/info lists (GENAUG_LORAS)",
        "adapter_scale": f"use a number from 0 to {MAX_ADAPTER_SCALE:g}",
        "strength": "use a number in (0, 1]: the share of the denoising schedule run",
    }
    return {
        "generate": {**common, "n": f"ask for 1 to max_n {s.max_n} images per call (the client "
                                    "can loop), or set GENAUG_MAX_N"},
        "variants": {**common, "n_per_image": f"ask for 1 to max_n {s.max_n} variants per "
                                              "image, or set GENAUG_MAX_N"},
        "sample": {
            "labels": "use labels of this recipe (GET /v1/recipes/{name}), or leave labels out "
                      "for all",
            "n": f"ask for 0 to max_sample_n {s.max_sample_n} images, or set "
                 "GENAUG_MAX_SAMPLE_N",
            "wait_s": f"wait 0 to max_timeout_s {s.max_timeout_s:g} seconds, or set "
                      "GENAUG_MAX_TIMEOUT_S",
        },
        "fill": {
            "per_label": f"ask for 1 to the pool capacity per label {capacity}, or set "
                         "GENAUG_POOL_CAPACITY_PER_LABEL",
            "images": f"ask for 1 to the pool capacity per label {capacity} times the "
                      "recipe's labels, less their targets now (GET /v1/recipes/{name}), or set "
                      "GENAUG_POOL_CAPACITY_PER_LABEL",
        },
        "feedback": {"need": f"give labels of this recipe (GET /v1/recipes/{{name}} lists them) "
                             f"each a number from 0 to {MAX_NEED:.0f}, e.g. "
                             '{"need": {"<label>": 0.5}}'},
    }


def build_api_models(
    settings: Settings,
    *,
    recipes: Mapping[str, Recipe],
    adapters: Sequence[str],
    defaults: tuple[int, int, float],
    schedulers: Sequence[str] = SCHEDULERS,
) -> ApiModels:
    """The request models of an app with these settings, recipes, adapter names and the
    schedulers its worker runs."""
    s = settings
    side = s.max_side - s.max_side % 8
    variant_images = s.max_n * s.max_variant_sources
    generate = create_model(
        "GenerateRequest",
        __base__=GenerateRequest,
        __doc__=GenerateRequest.__doc__,
        **_generation_fields(s, adapters, schedulers, max_images=s.max_n),
        n=(int, Field(default=1, ge=1, le=s.max_n, description="Number of images.")),
        height=(int | None, Field(default=None, ge=8, le=side, multiple_of=8,
                                  description="Generation height.")),
        width=(int | None, Field(default=None, ge=8, le=side, multiple_of=8,
                                 description="Generation width.")),
    )
    variants = create_model(
        "VariantParams",
        __base__=VariantParams,
        __doc__=VariantParams.__doc__,
        **_generation_fields(s, adapters, schedulers, max_images=variant_images),
        strength=(float, Field(default=0.5, gt=0, le=1, allow_inf_nan=False,
                               description="Share of the schedule run: 1.0 ignores the source.")),
        n_per_image=(int, Field(default=1, ge=1, le=s.max_n, description="Variants per source.")),
    )
    sample: dict[str, type[SampleRequest]] = {}
    fill: dict[str, type[FillRequest]] = {}
    feedback: dict[str, type[FeedbackRequest]] = {}
    for name, recipe in recipes.items():
        label: Any = _choice(recipe.label_names)
        suffix = "".join(part.capitalize() for part in name.replace("_", "-").split("-"))
        sample[name] = create_model(
            f"SampleRequest{suffix}",
            __base__=SampleRequest,
            __doc__=f"``POST /v1/recipes/{name}/sample``: images from the pool of {name!r}.",
            labels=(label | Annotated[list[label], Field(min_length=1)] | None, Field(
                default=None,
                description="One label, a list, or none for all of the recipe's labels.")),
            n=(int, Field(default=64, ge=0, le=s.max_sample_n,
                          description="Most images to return.")),
            wait_s=(float, Field(default=0.0, ge=0, le=s.max_timeout_s, allow_inf_nan=False,
                                 description="Wait up to this long for generation when the pool "
                                             "holds too few.")),
        )
        fill[name] = create_model(
            f"FillRequest{suffix}",
            __base__=FillRequest,
            __doc__=f"``POST /v1/recipes/{name}/fill``: fill each label of {name!r} to "
                    "per_label, or generate images more split by need (one of the two).",
            # Not nullable: leave a field out to not give it (the schema's oneOf says so).
            per_label=(int, Field(default=None, ge=1, le=s.pool_capacity_per_label,
                                  description="Images per label to fill to.")),
            images=(int, Field(
                default=None, ge=1, le=s.pool_capacity_per_label * len(recipe.label_names),
                description="Images to generate more, split over the labels by the "
                            "trainers' need and recent demand.")),
        )
        amount = Annotated[float, Field(ge=0, le=MAX_NEED, allow_inf_nan=False)]
        feedback[name] = create_model(
            f"FeedbackRequest{suffix}",
            __base__=FeedbackRequest,
            __doc__=f"``POST /v1/recipes/{name}/feedback``: this client's need per label of "
                    f"{name!r} (only proportions count; {{}} withdraws it).",
            need=(dict[label, amount], Field(
                description="Need per label, 0 to 1e6; labels left out need nothing.")),
        )
    return ApiModels(
        generate=generate,
        variants=variants,
        sample=sample,
        fill=fill,
        feedback=feedback,
        hints=_hints(s, s.pool_capacity_per_label),
        defaults=defaults,
        adapters=tuple(adapters),
        max_side=s.max_side,
    )

