"""Request bodies of the HTTP API: pydantic, ``extra="forbid"``, explicit bounds.

The request models are built per app by :func:`build_api_models` from the running
configuration, so the schema served at ``/openapi.json`` and the validation are one thing:
operator limits (``GENAUG_MAX_SIDE`` ...) are the maxima, recipe labels and adapter names are
enums, and a bound that involves two fields is folded into one field's bound (``seed`` stops
``max_n - 1`` below the largest seed, so ``seed + n - 1`` always fits). What the schema admits,
the service accepts; the few dynamic answers no schema can express (a full queue, a deadline,
a model still loading) are listed in docs/reliability.md. The answers' models are the HTTP
edge's (``api/responses.py``).

Each request field is declared once, on its class below: its type, default and description,
its :class:`Bound` (numbers, or names of settings, resolved per app) and its :class:`Fix` (the
hint a 422 gives). :func:`build_api_models` derives the per-app models and the hints from
these declarations, and refuses a field that lacks either. A new field::

    steps: Annotated[int | None, Field(description="Denoising steps."),
                     Bound(ge=1, le="max_steps"),
                     Fix("use 1 to max_steps {max_steps}, or set GENAUG_MAX_STEPS")] = None

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
import operator
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    create_model,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..batching.items import SCHEDULERS
from ..settings import Settings

if TYPE_CHECKING:
    from ..recipes.spec import Recipe

Priority = Literal["interactive", "bulk"]
M = TypeVar("M", bound=BaseModel)
SEED_MAX = 2**63 - 1
#: The shortest ``timeout_s`` a request may set: a shorter deadline could never be met.
MIN_TIMEOUT_S = 0.5
MAX_GUIDANCE = 50.0
MAX_ADAPTER_SCALE = 4.0
#: The largest need one label may be given (only proportions count; this bounds the numbers).
MAX_NEED = 1e6
#: The most seeds one verdict may name (a page of the pool page is at most this many images).
MAX_VERDICT_SEEDS = 500
#: The most images one page of ``GET /v1/recipes/{name}/images`` lists.
MAX_BROWSE_LIMIT = 500
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


def _int_list(annotation: Any) -> bool:
    """Whether a (possibly optional) field annotation is a list of integers."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _int_list(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return any(_int_list(a) for a in typing.get_args(annotation))
    return origin is list and _numeric_kind(typing.get_args(annotation)[0]) == "int"


@functools.cache
def _numeric_fields(
    cls: type[BaseModel],
) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    ints, floats, int_lists = set(), set(), set()
    for name, info in cls.model_fields.items():
        kind = _numeric_kind(info.annotation)
        if kind == "int":
            ints.add(name)
        elif kind == "float":
            floats.add(name)
        elif _int_list(info.annotation):
            int_lists.add(name)
    return frozenset(ints), frozenset(floats), frozenset(int_lists)


class Body(BaseModel):
    """Base of every request body: strict types, unknown fields refused, JSON numbers as
    JSON Schema reads them (an integral ``4.0`` is an integer, ``4`` is a number)."""

    model_config = ConfigDict(extra="forbid", strict=True, regex_engine="python-re")

    @model_validator(mode="before")
    @classmethod
    def _json_numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        ints, floats, int_lists = _numeric_fields(cls)
        out = dict(data)
        for name in ints & out.keys():
            value = out[name]
            if isinstance(value, float) and value.is_integer():
                out[name] = int(value)
        for name in int_lists & out.keys():
            value = out[name]
            if isinstance(value, list):
                out[name] = [int(v) if isinstance(v, float) and v.is_integer() else v
                             for v in value]
        for name in floats & out.keys():
            value = out[name]
            if isinstance(value, int) and not isinstance(value, bool):
                out[name] = float(value)
        return out


@dataclass(frozen=True)
class Limits:
    """What a bound may depend on: the app's settings, the most images one request of the
    route makes, and the app's choice lists (``schedulers``, ``adapters``, a recipe's
    ``labels``)."""

    settings: Settings
    images: int = 1
    choices: Mapping[str, Sequence[str]] = dataclass_field(default_factory=dict)

    def resolve(self, value: Limit) -> Any:
        if isinstance(value, str):
            return getattr(self.settings, value)
        if callable(value):
            return value(self)
        return value


#: A bound's value: a number, the name of a setting (``"max_steps"``), or a function of the
#: app's :class:`Limits`.
Limit = int | float | str | Callable[[Limits], float]


@dataclass(frozen=True)
class Bound:
    """What a request field admits, as a pydantic ``Field`` constraint each (resolved per app
    by :class:`Limits`), plus:

    - ``one_of``: the field's ``str`` becomes an enum of that choice list of the app;
    - ``absent``: when the choice list ``needs`` (default ``one_of``) is empty, the field
      admits only null, with this description;
    - ``null=False``: the field is left out to not give it, null is refused.

    ``Bound()`` with nothing is for a field whose type is closed (a ``Literal``).
    """

    ge: Limit | None = None
    gt: Limit | None = None
    le: Limit | None = None
    multiple_of: Limit | None = None
    min_length: Limit | None = None
    max_length: Limit | None = None
    pattern: str | None = None
    one_of: str | None = None
    needs: str | None = None
    absent: str | None = None
    null: bool = True

    def constraints(self, limits: Limits) -> dict[str, Any]:
        """The pydantic ``Field`` constraints with this app's numbers."""
        names = ("ge", "gt", "le", "multiple_of", "min_length", "max_length")
        out = {name: limits.resolve(getattr(self, name)) for name in names
               if getattr(self, name) is not None}
        if self.pattern is not None:
            out["pattern"] = self.pattern
        return out


@dataclass(frozen=True)
class Fix:
    """The fix a 422 names for a field: a ``str.format`` template over the settings' names
    (``{max_steps}``) and this module's limits (``{MAX_GUIDANCE:g}``); ``{{name}}`` is the
    recipe's name in the URL."""

    text: str

    def render(self, settings: Settings) -> str:
        return self.text.format_map(_Names(settings))


class _Names(dict[str, Any]):
    def __init__(self, settings: Settings) -> None:
        super().__init__(MIN_TIMEOUT_S=MIN_TIMEOUT_S, MAX_GUIDANCE=MAX_GUIDANCE,
                         MAX_ADAPTER_SCALE=MAX_ADAPTER_SCALE, MAX_NEED=MAX_NEED,
                         MAX_VERDICT_SEEDS=MAX_VERDICT_SEEDS,
                         schedulers=", ".join(SCHEDULERS))
        self.settings = settings

    def __missing__(self, key: str) -> Any:
        return getattr(self.settings, key)


def _side(limits: Limits) -> int:
    """The largest generation side: ``max_side`` down to a multiple of 8."""
    return limits.settings.max_side - limits.settings.max_side % 8


def _last_seed(limits: Limits) -> int:
    """The largest first seed: image ``i`` uses ``seed + i``, so every seed of the route's
    largest request fits."""
    return SEED_MAX - (limits.images - 1)


def _fill_images(limits: Limits) -> int:
    return limits.settings.pool_capacity_per_label * len(limits.choices.get("labels", ()))


_OUT_SIDE = "use 1 to max_side {max_side}, or set GENAUG_MAX_SIDE"
_SIDE = "use a multiple of 8 from 8 to max_side {max_side}, or set GENAUG_MAX_SIDE"


class GenerationFields(Body):
    """The fields generate and the variants' params share: what to draw, at which output
    size, with which steps, guidance, seed, scheduler and adapter, how urgent and for how long.

    The base of :class:`GenerateRequest` and :class:`VariantParams`; each field's bound and
    fix are declared here once for both (:func:`build_api_models` resolves them per app).
    Example::

        body = GenerateRequest(prompt="a red circle", n=2)
        isinstance(body, GenerationFields), body.priority   # True, 'interactive'
    """

    prompt: Annotated[
        str, Field(description="What to draw."),
        Bound(min_length=1, max_length="max_prompt_chars", pattern=_NON_BLANK),
        Fix("send 1 to max_prompt_chars {max_prompt_chars} characters with some non-space "
            "text, or set GENAUG_MAX_PROMPT_CHARS")]
    negative_prompt: Annotated[
        str | None, Field(description="What to avoid."), Bound(max_length="max_prompt_chars"),
        Fix("send at most max_prompt_chars {max_prompt_chars} characters or leave it out")
    ] = None
    output_height: Annotated[
        int | None, Field(description="Resize the output to this height."),
        Bound(ge=1, le="max_side"), Fix(_OUT_SIDE)] = None
    output_width: Annotated[
        int | None, Field(description="Resize the output to this width."),
        Bound(ge=1, le="max_side"), Fix(_OUT_SIDE)] = None
    steps: Annotated[
        int | None, Field(description="Denoising steps."), Bound(ge=1, le="max_steps"),
        Fix("use 1 to max_steps {max_steps}, or set GENAUG_MAX_STEPS")] = None
    guidance: Annotated[
        float | None, Field(description="Classifier-free guidance scale."),
        Bound(ge=0, le=MAX_GUIDANCE), Fix("use a number from 0 to {MAX_GUIDANCE:g}")] = None
    seed: Annotated[
        int | None, Field(description="Seed of the first image; image i uses seed + i."),
        Bound(ge=0, le=_last_seed),
        Fix("use an integer from 0 up to the schema's maximum (the largest seed less the "
            "images of one request), or leave it out for random seeds")] = None
    priority: Annotated[Priority, Bound(), Fix("use 'interactive' or 'bulk'")] = "interactive"
    timeout_s: Annotated[
        float | None, Field(description="Deadline; past it the answer is 504."),
        Bound(ge=MIN_TIMEOUT_S, le="max_timeout_s"),
        Fix("use {MIN_TIMEOUT_S:g} to max_timeout_s {max_timeout_s:g} seconds, or set "
            "GENAUG_MAX_TIMEOUT_S")] = None
    scheduler: Annotated[
        str | None, Field(description="Sampler; default: the service's (GENAUG_SCHEDULER)."),
        Bound(one_of="schedulers"), Fix("use one of {schedulers}")] = None
    adapter: Annotated[
        str | None, Field(description="LoRA adapter (GENAUG_LORAS)."),
        Bound(one_of="adapters", absent="No GENAUG_LORAS set."),
        Fix("use one of the adapters GET /v1/info lists (GENAUG_LORAS)")] = None
    adapter_scale: Annotated[
        float | None, Field(description="Adapter strength (default 1.0)."),
        Bound(ge=0, le=MAX_ADAPTER_SCALE, needs="adapters", absent="No adapters."),
        Fix("use a number from 0 to {MAX_ADAPTER_SCALE:g}")] = None


class GenerateRequest(GenerationFields):
    """``POST /v1/generate``. Omitted size, steps and guidance take the service defaults.

    Example body::

        {"prompt": "depth image of a healing wound", "n": 4, "height": 64, "width": 64,
         "seed": 7}

    Image ``i`` uses seed ``seed + i`` (or a drawn seed); the seeds always come back. With one
    of ``output_height``/``output_width`` the other keeps the generated aspect ratio.
    """

    n: Annotated[
        int, Field(description="Number of images."), Bound(ge=1, le="max_n"),
        Fix("ask for 1 to max_n {max_n} images per call (the client can loop), or set "
            "GENAUG_MAX_N")] = 1
    height: Annotated[
        int | None, Field(description="Generation height."),
        Bound(ge=8, le=_side, multiple_of=8), Fix(_SIDE)] = None
    width: Annotated[
        int | None, Field(description="Generation width."),
        Bound(ge=8, le=_side, multiple_of=8), Fix(_SIDE)] = None


class VariantParams(GenerationFields):
    """The ``params`` part of ``POST /v1/variants`` (multipart): how to vary the sources.

    Example part::

        {"prompt": "a handwritten three", "strength": 0.5, "n_per_image": 4, "seed": 1}

    Variant ``k`` of source ``j`` uses seed ``seed + j * n_per_image + k``.
    """

    strength: Annotated[
        float, Field(description="Share of the schedule run: 1.0 ignores the source."),
        Bound(gt=0, le=1),
        Fix("use a number in (0, 1]: the share of the denoising schedule run")] = 0.5
    n_per_image: Annotated[
        int, Field(description="Variants per source."), Bound(ge=1, le="max_n"),
        Fix("ask for 1 to max_n {max_n} variants per image, or set GENAUG_MAX_N")] = 1


class SampleRequest(Body):
    """``POST /v1/recipes/{name}/sample``: images from the recipe's pool.

    Example body::

        {"labels": ["I", "P"], "n": 64, "wait_s": 2.0}
    """

    labels: Annotated[
        str | Annotated[list[str], Field(min_length=1)] | None,
        Field(description="One label, a list, or none for all of the recipe's labels."),
        Bound(one_of="labels"),
        Fix("use labels of this recipe (GET /v1/recipes/{{name}}), or leave labels out for "
            "all")] = None
    n: Annotated[
        int, Field(description="Most images to return."), Bound(ge=0, le="max_sample_n"),
        Fix("ask for 0 to max_sample_n {max_sample_n} images, or set GENAUG_MAX_SAMPLE_N")
    ] = 64
    wait_s: Annotated[
        float, Field(description="Wait up to this long for generation when the pool holds "
                                 "too few."),
        Bound(ge=0, le="max_timeout_s"),
        Fix("wait 0 to max_timeout_s {max_timeout_s:g} seconds, or set GENAUG_MAX_TIMEOUT_S")
    ] = 0.0


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

    # Not nullable (null=False): leave a field out to not give it (the schema's oneOf says so).
    per_label: Annotated[
        int | None, Field(description="Images per label to fill to."),
        Bound(ge=1, le="pool_capacity_per_label", null=False),
        Fix("ask for 1 to the pool capacity per label {pool_capacity_per_label}, or set "
            "GENAUG_POOL_CAPACITY_PER_LABEL")] = None
    images: Annotated[
        int | None, Field(description="Images to generate more, split over the labels by the "
                                      "trainers' need and recent demand."),
        Bound(ge=1, le=_fill_images, null=False),
        Fix("ask for 1 to the pool capacity per label {pool_capacity_per_label} times the "
            "recipe's labels, less their targets now (GET /v1/recipes/{{name}}), or set "
            "GENAUG_POOL_CAPACITY_PER_LABEL")] = None

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

    need: Annotated[
        dict[str, Annotated[float, Field(ge=0, le=MAX_NEED, allow_inf_nan=False)]],
        Field(description="Need per label, 0 to 1e6; labels left out need nothing."),
        Bound(one_of="labels"),
        Fix("give labels of this recipe (GET /v1/recipes/{{name}} lists them) each a number "
            'from 0 to {MAX_NEED:.0f}, e.g. {{"need": {{"<label>": 0.5}}}}')]


def _decimal_up_to(limit: int) -> str:
    """A regular expression of the decimal numbers 0 to ``limit``, without sign or leading
    zeros (one way to write each number, as ``str(int)`` writes it)."""
    text = str(limit)
    shorter = ["0"] if len(text) == 1 else ["0", f"[1-9][0-9]{{0,{len(text) - 2}}}"]
    longest = []  # as long as ``limit``: its first i digits, a smaller one, then any
    for i, digit in enumerate(text):
        low, rest = (1 if i == 0 else 0), len(text) - i - 1
        if int(digit) > low:
            longest.append(text[:i] + f"[{low}-{int(digit) - 1}]" + (f"[0-9]{{{rest}}}"
                                                                    if rest else ""))
    return "^(?:" + "|".join([*shorter, *longest, text]) + ")$"


#: A seed written as text: JSON numbers above 2**53 lose digits in JavaScript, so a page
#: sends the seed as the decimal string the listing gives (``seed_str``).
SEED_TEXT_PATTERN = _decimal_up_to(SEED_MAX)
_SEED_TEXT = re.compile(SEED_TEXT_PATTERN)


def _seed_from_text(value: Any) -> Any:
    """A decimal seed string as its integer; anything else as it came (the integer check
    follows). The pattern rules out what ``int()`` would also take (signs, spaces, ``_``)."""
    if not isinstance(value, str):
        return value
    if _SEED_TEXT.fullmatch(value) is None:  # not match: "$" passes a final newline
        raise PydanticCustomError(
            "seed_text", f"not a seed: a seed is an integer from 0 to {SEED_MAX} (2**63 - 1), "
            "or that integer as a decimal string without sign, spaces or leading zeros")
    return int(value)


#: One seed of a verdict: an integer, or the same as a decimal string (what a browser can
#: carry without loss); the schema says both.
SeedValue = Annotated[
    int, BeforeValidator(_seed_from_text), Field(ge=0, le=SEED_MAX),
    WithJsonSchema({"anyOf": [
        {"type": "integer", "minimum": 0, "maximum": SEED_MAX},
        {"type": "string", "pattern": SEED_TEXT_PATTERN,
         "description": "The seed as a decimal string (JavaScript loses digits of numbers "
                        "above 2**53)."}]}),
]


class VerdictRequest(Body):
    """``POST /v1/recipes/{name}/verdicts``: a person's verdict on pool images of one label,
    named by the seeds samples return.

    Example bodies::

        {"label": "3", "seeds": [17, 42], "keep": false}   # reject: never sampled again
        {"label": "3", "seeds": [17], "keep": true}        # restore (overrides the judge)

    All or nothing: when a seed names no image of the label, nothing is applied (404).
    A seed may also be sent as its decimal string (``"4226573310164136400"``), as the pool
    page does: JSON numbers above 2**53 lose digits in a browser.
    """

    label: Annotated[
        str, Field(description="The label whose images these are."), Bound(one_of="labels"),
        Fix("use a label of this recipe (GET /v1/recipes/{{name}} lists them)")]
    seeds: Annotated[
        list[SeedValue],
        Field(description="Seeds of the label's images (as samples and "
                          "GET /v1/recipes/{name}/images return them), each an integer or "
                          "its decimal string (seed_str)."),
        Bound(min_length=1, max_length=MAX_VERDICT_SEEDS),
        Fix("send 1 to {MAX_VERDICT_SEEDS} seeds, each an integer from 0 to 2**63 - 1 as "
            "samples return them or its decimal string (the listing's seed_str); split "
            "longer lists over several calls")]
    keep: Annotated[
        bool, Field(description="false rejects the images (never sampled again, on every "
                                "replica); true restores them (overriding the judge)."),
        Bound(), Fix("send true (restore) or false (reject)")]


def _choice(names: Sequence[str]) -> Any:
    return Literal[tuple(names)]  # a Literal of runtime values: an enum in the schema


def _swap_str(annotation: Any, choice: Any) -> Any:
    """``annotation`` with every ``str`` in it (inside unions, lists, dict keys, Annotated)
    replaced by ``choice``."""
    if annotation is str:
        return choice
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return Annotated[(_swap_str(args[0], choice), *annotation.__metadata__)]
    if origin in (Union, types.UnionType):
        return functools.reduce(operator.or_, (_swap_str(a, choice) for a in args))
    if origin in (list, dict):
        return origin[tuple(_swap_str(a, choice) for a in args)]
    return annotation


def _non_null(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return functools.reduce(operator.or_, args)
    return annotation


def declaration(model: type[BaseModel], name: str) -> tuple[Bound, Fix]:
    """The :class:`Bound` and :class:`Fix` declared on ``model``'s field ``name``.

    Raises:
        TypeError: the field lacks one (every request field declares both).
    """
    metadata = model.model_fields[name].metadata
    bounds = [m for m in metadata if isinstance(m, Bound)]
    fixes = [m for m in metadata if isinstance(m, Fix)]
    if len(bounds) != 1 or len(fixes) != 1:
        raise TypeError(
            f"{model.__name__}.{name} must declare one Bound and one Fix (found "
            f"{len(bounds)} and {len(fixes)}): write them in its Annotated[...] so that the "
            "served schema bounds it and a 422 says how to fix it")
    return bounds[0], fixes[0]


def _bounded_field(model: type[BaseModel], name: str, limits: Limits) -> tuple[Any, Any]:
    """``(annotation, Field(...))`` of field ``name`` with this app's bounds."""
    info = model.model_fields[name]
    bound, _ = declaration(model, name)
    annotation = info.annotation
    if bound.absent is not None and not limits.choices.get(bound.needs or bound.one_of or ""):
        return None, Field(default=None, description=bound.absent)
    if bound.one_of is not None:
        annotation = _swap_str(annotation, _choice(limits.choices[bound.one_of]))
    if not bound.null:
        annotation = _non_null(annotation)
    constraints = bound.constraints(limits)
    if _numeric_kind(annotation) == "float":
        constraints["allow_inf_nan"] = False
    return annotation, Field(default=info.default, description=info.description, **constraints)


def bounded_model(model: type[M], limits: Limits, *, name: str | None = None,
                  doc: str | None = None) -> type[M]:
    """``model`` with every field bounded for this app: a subclass of ``model``."""
    fields = {field: _bounded_field(model, field, limits) for field in model.model_fields}
    derived: type[M] = create_model(  # type: ignore[call-overload]
        name or model.__name__, __base__=model, __doc__=doc or model.__doc__, **fields)
    return derived


#: The request model of each route whose 422s name a fix (``ApiModels.hints``' keys).
ROUTE_MODELS: Mapping[str, type[Body]] = {
    "generate": GenerateRequest,
    "variants": VariantParams,
    "sample": SampleRequest,
    "fill": FillRequest,
    "feedback": FeedbackRequest,
    "verdicts": VerdictRequest,
}


def hints(settings: Settings) -> dict[str, dict[str, str]]:
    """The fix of each field per route, with this app's numbers."""
    return {route: {field: declaration(model, field)[1].render(settings)
                    for field in model.model_fields}
            for route, model in ROUTE_MODELS.items()}


@dataclass(frozen=True)
class ApiModels:
    """The request models of one app, bounded by its settings, recipes and adapters.

    ``sample``, ``fill``, ``feedback`` and ``verdicts`` hold one model per recipe (its labels are an
    enum); ``hints`` the fix a 422 names, per route and field; ``defaults`` the (size, steps,
    guidance) that omitted fields take.
    """

    generate: type[GenerateRequest]
    variants: type[VariantParams]
    sample: Mapping[str, type[SampleRequest]]
    fill: Mapping[str, type[FillRequest]]
    feedback: Mapping[str, type[FeedbackRequest]]
    verdicts: Mapping[str, type[VerdictRequest]]
    hints: Mapping[str, Mapping[str, str]]
    defaults: tuple[int, int, float]
    adapters: tuple[str, ...]
    max_side: int


def build_api_models(
    settings: Settings,
    *,
    recipes: Mapping[str, Recipe],
    adapters: Sequence[str],
    defaults: tuple[int, int, float],
    schedulers: Sequence[str] = SCHEDULERS,
) -> ApiModels:
    """The request models of an app with these settings, recipes, adapter names and the
    schedulers its worker runs: each declared field with its bound resolved.

    Raises:
        ValueError: ``max_side`` below 8 (no multiple of 8 to generate at).
        TypeError: a request field that declares no :class:`Bound` or :class:`Fix`.
    """
    s = settings
    if _side(Limits(s)) < 8:
        raise ValueError(f"max_side {s.max_side} leaves no multiple of 8 to generate at")
    choices = {"schedulers": tuple(schedulers), "adapters": tuple(adapters)}
    generate = bounded_model(GenerateRequest, Limits(s, s.max_n, choices))
    variants = bounded_model(
        VariantParams, Limits(s, s.max_n * s.max_variant_sources, choices))
    sample: dict[str, type[SampleRequest]] = {}
    fill: dict[str, type[FillRequest]] = {}
    feedback: dict[str, type[FeedbackRequest]] = {}
    verdicts: dict[str, type[VerdictRequest]] = {}
    for name, recipe in recipes.items():
        limits = Limits(s, choices={**choices, "labels": tuple(recipe.label_names)})
        suffix = "".join(part.capitalize() for part in name.replace("_", "-").split("-"))
        sample[name] = bounded_model(
            SampleRequest, limits, name=f"SampleRequest{suffix}",
            doc=f"``POST /v1/recipes/{name}/sample``: images from the pool of {name!r}.")
        fill[name] = bounded_model(
            FillRequest, limits, name=f"FillRequest{suffix}",
            doc=f"``POST /v1/recipes/{name}/fill``: fill each label of {name!r} to "
                "per_label, or generate images more split by need (one of the two).")
        feedback[name] = bounded_model(
            FeedbackRequest, limits, name=f"FeedbackRequest{suffix}",
            doc=f"``POST /v1/recipes/{name}/feedback``: this client's need per label of "
                f"{name!r} (only proportions count; {{}} withdraws it).")
        verdicts[name] = bounded_model(
            VerdictRequest, limits, name=f"VerdictRequest{suffix}",
            doc=f"``POST /v1/recipes/{name}/verdicts``: a person rejects (keep false) or "
                f"restores (keep true) images of one label of {name!r}, by seed.")
    return ApiModels(
        generate=generate,
        variants=variants,
        sample=sample,
        fill=fill,
        feedback=feedback,
        verdicts=verdicts,
        hints=hints(s),
        defaults=defaults,
        adapters=tuple(adapters),
        max_side=s.max_side,
    )
