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
its :class:`~genaug.service.intake.fields.Bound` (numbers, or names of settings, resolved per
app) and its :class:`~genaug.service.intake.fields.Fix` (the hint a 422 gives). This module
holds the request classes and the per-app assembly; the declaration machinery they share
(``Bound``, ``Fix``, ``Limits``, the ``Body`` base, the derivation of bounded models) is
:mod:`~genaug.service.intake.fields`. :func:`build_api_models` derives the per-app models and
the hints from these declarations, and refuses a field that lacks either. A new field::

    steps: Annotated[int | None, Field(description="Denoising steps."),
                     Bound(ge=1, le="max_steps"),
                     Fix("use 1 to max_steps {max_steps}, or set GENAUG_MAX_STEPS")] = None

JSON numbers: an integer field accepts an integral number (``4.0``), as JSON Schema's
``integer`` does, and a number field accepts an integer; strings and booleans are refused.

Example::

    models = build_api_models(Settings(max_n=8), recipes={}, adapters=(),
                              defaults=(64, 4, 5.0), turbo=None)
    body = models.generate.model_validate_json(b'{"prompt": "a wound", "n": 4}')
    body.n   # 4
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from ..batching.items import SCHEDULERS
from ..sampling.modes import SPEEDS, Turbo
from ..settings import Settings
from ..settings.notify_url import (
    MAX_URL_CHARS,
    RefusedUrl,
    allowed_hosts,
    check_notify_url,
    fix_text,
    notify_url_pattern,
)
from .fields import (
    MAX_ADAPTER_SCALE,
    MAX_GUIDANCE,
    MAX_NEED,
    MAX_VERDICT_SEEDS,
    MIN_TIMEOUT_S,
    SEED_MAX,
    Body,
    Bound,
    Fix,
    Limits,
    Refused,
    SeedValue,
    bounded_model,
    declaration,
)

if TYPE_CHECKING:
    from ..recipes.spec import Recipe

Priority = Literal["interactive", "bulk"]
#: The most images one page of ``GET /v1/recipes/{name}/images`` lists.
MAX_BROWSE_LIMIT = 500
# A prompt needs one non-space character. The space characters are listed, not written
# ``\S``: Python's ``\s`` (which validates) and JSON Schema's ECMA ``\s`` (which clients and
# fuzzers read) differ on \x1c-\x1f and \ufeff; listing the union makes both read the same.
_NON_BLANK = (r"[^\x09-\x0d\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f"
              r"\u205f\u3000\ufeff]")


def _side(limits: Limits) -> int:
    """The largest generation side: ``max_side`` down to a multiple of 8."""
    return limits.settings.max_side - limits.settings.max_side % 8


def _last_seed(limits: Limits) -> int:
    """The largest first seed: image ``i`` uses ``seed + i``, so every seed of the route's
    largest request fits."""
    return SEED_MAX - (limits.images - 1)


def _webhook_hosts(limits: Limits) -> tuple[str, ...]:
    return tuple(limits.choices.get("webhook_hosts", ()))


def _notify_url_check(limits: Limits) -> Callable[[str], str]:
    """``notify_url``'s one rule with this app's hosts: the URL normalised, or the reason."""
    hosts = _webhook_hosts(limits)

    def check(url: str) -> str:
        try:
            return check_notify_url(url, hosts)
        except RefusedUrl as exc:
            raise Refused(str(exc)) from None
    return check


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
    speed: Annotated[
        str | None, Field(description="quality (default) or turbo: the model's few-step setting "
                          "(GET /v1/info's turbo); steps, scheduler or guidance given win."),
        Bound(one_of="speeds"),
        Fix("use quality or turbo (a model folder serves turbo with GENAUG_TURBO_LORA)")] = None


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
    notify_url: Annotated[
        str | None, Field(description="Where to POST the fill's job when it ends (signed; "
                                      "only hosts in GENAUG_WEBHOOK_HOSTS)."),
        Bound(min_length=1, max_length=MAX_URL_CHARS,
              pattern=lambda limits: notify_url_pattern(_webhook_hosts(limits)),
              check=_notify_url_check, needs="webhook_hosts", null=False,
              absent="Webhooks are off on this service (GENAUG_WEBHOOK_HOSTS is empty): "
                     "leave it out."),
        Fix(lambda settings: fix_text(allowed_hosts(settings.webhook_hosts)))] = None

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
    guidance) that omitted fields take; ``turbo`` what ``speed: turbo`` draws with (or None).
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
    turbo: Turbo | None = None


def build_api_models(
    settings: Settings,
    *,
    recipes: Mapping[str, Recipe],
    adapters: Sequence[str],
    defaults: tuple[int, int, float],
    turbo: Turbo | None,
    schedulers: Sequence[str] = SCHEDULERS,
) -> ApiModels:
    """The request models of an app with these settings, recipes, adapter names, turbo mode
    (the service's, resolved once: ``speed: turbo`` is admitted when it is not None) and the
    schedulers its worker runs: each declared field with its bound resolved.

    Raises:
        ValueError: ``max_side`` below 8 (no multiple of 8 to generate at).
        TypeError: a request field that declares no :class:`Bound` or :class:`Fix`.
    """
    s = settings
    if _side(Limits(s)) < 8:
        raise ValueError(f"max_side {s.max_side} leaves no multiple of 8 to generate at")
    choices = {"schedulers": tuple(schedulers), "adapters": tuple(adapters),
               "webhook_hosts": allowed_hosts(s.webhook_hosts),
               "speeds": SPEEDS if turbo is not None else SPEEDS[:1]}
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
    return ApiModels(generate=generate, variants=variants, sample=sample, fill=fill,
                     feedback=feedback, verdicts=verdicts, hints=hints(s), defaults=defaults,
                     adapters=tuple(adapters), max_side=s.max_side, turbo=turbo)
