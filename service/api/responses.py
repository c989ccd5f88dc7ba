"""What the HTTP API answers: the response models, the error statuses each route documents,
and the encoding of image payloads off the event loop when they are large.

The request models are the intake's (:mod:`~genaug.service.intake.schemas`); these are the
answers, serialized by FastAPI and documented in ``/openapi.json``. Every non-2xx answer has
the one shape :class:`ErrorBody` (:mod:`~genaug.service.api.errors`). The routes that
answer images declare only the bytes they send (:func:`binary_answer`): their media types
with a binary schema and, for a safetensors batch, its layout (:data:`SAFETENSORS_LAYOUT`),
so a client generated from the schema reads the body as bytes, never as JSON.

Example::

    @router.get("/v1/clients", response_model=ClientsResponse, responses=READ_ERRORS)
    async def clients(request: Request) -> ClientsResponse: ...
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from ..batching.batcher import MAX_PAUSED
from ..jobs.view import JobRef, JobView

# Encode in the event loop below this many bytes of pixels (a thread hop costs more).
_INLINE_ENCODE_BYTES = 1 << 20

#: The JSON Schema of a body of raw bytes (a generated client reads it as a file).
BINARY_SCHEMA: dict[str, Any] = {"type": "string", "format": "binary"}

#: How a safetensors batch is laid out, for the answers' descriptions in ``/openapi.json``
#: (``genaug.wire`` reads and writes it; docs/clients.md shows how to read it without genaug).
SAFETENSORS_LAYOUT = (
    "A safetensors file: 8 bytes (unsigned, little-endian) giving the length of a JSON "
    "header, the header, then the tensors' raw little-endian bytes back to back. The header "
    "maps each tensor's name to its dtype (U8, I32 or I64), shape and data_offsets ([begin, "
    "end) in bytes from the end of the header), and __metadata__ to string values; metadata "
    "that is not a string is JSON under a key ending in _json. "
)


def binary_answer(
    description: str, *media_types: str
) -> dict[int | str, dict[str, Any]]:
    """The 200 entry of a route that answers bytes: each of ``media_types`` with
    :data:`BINARY_SCHEMA`. The route sets ``response_class=Response`` so that FastAPI adds
    no ``application/json`` answer it never sends."""
    return {200: {"description": description,
                  "content": {media: {"schema": dict(BINARY_SCHEMA)} for media in media_types}}}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses a route answers, all with the one error shape.

    401 is listed everywhere but the open paths: it is what any route answers when API keys
    are configured and the request has none.
    """
    return {code: {"model": ErrorBody} for code in (401, *codes)}


async def encoded(images: np.ndarray, encode: Callable[[], bytes]) -> bytes:
    """Run ``encode`` inline for small batches, in a thread for large ones."""
    if images.nbytes > _INLINE_ENCODE_BYTES:
        return await asyncio.to_thread(encode)
    return encode()


class ErrorDetail(BaseModel):
    type: str
    message: str
    field: str | None = None
    id: str | None = None


class ErrorBody(BaseModel):
    """The one error shape every non-2xx answer has."""

    error: ErrorDetail


class Limits(BaseModel):
    """The operator's bounds (``GENAUG_MAX_*``) and the defaults of omitted fields."""

    max_n: int
    max_side: int
    max_steps: int
    max_batch_images: int
    max_queue_images: int
    max_wait_ms: float
    max_prompt_chars: int
    max_timeout_s: float
    min_timeout_s: float
    max_sample_n: int
    max_body_bytes: int
    max_upload_bytes: int
    max_variant_sources: int
    default_size: int
    default_steps: int
    default_guidance: float
    default_timeout_s: float


class ModelInfo(BaseModel):
    """What is loaded: ``kind`` (tiny-digits, tiny-digits-base, tiny-random, diffusers,
    single-file), where from, a content hash of the weights, and what the model was trained on
    (``trained_on``: the training record of tiny-digits, tiny-digits-base and folders written
    by tools/train_tiny_generator.py: data set, split, ``labels`` (the labels trained on and
    their prompts; tiny-digits-base: 0-4 only), steps, seed, ...; ``null`` when unknown)."""

    kind: str
    source: str
    hash: str
    dtype: str
    trained_on: dict[str, Any] | None = None


class DeviceInfo(BaseModel):
    """Where the pipeline runs. ``cuda_uuid`` and ``pci_bus_id`` identify a CUDA device so a
    trainer on the same host can hide it from TensorFlow (``configure_devices``)."""

    name: str
    type: str
    cuda_uuid: str | None = None
    pci_bus_id: str | None = None
    torch_threads: int | None = None


class AdapterInfo(BaseModel):
    name: str
    hash: str
    source: str
    rank: int | None = Field(None, description="The file's LoRA rank.")


class WarmupInfo(BaseModel):
    """The warm-up as ``/readyz`` says it: ``text`` (``warming 3 of 8: 1024x1024 batch 4 (41
    s, compiling)``, then ``warmed up: 8 shape(s) in 52 s``), the steps done of the total."""

    done: int
    total: int
    finished: bool
    text: str


class CompileCacheInfo(BaseModel):
    """``GENAUG_COMPILE_CACHE``: the folder, this start's key, and ``state``: ``hit``,
    ``miss``, ``skipped: <why>``, ``kept`` or ``saved <n> files (<size>)``."""

    folder: str
    key: str
    state: str


class AccelerationInfo(BaseModel):
    """The acceleration options in force and the shapes compiled at warm-up. ``attention`` is the
    setting, ``attention_backend`` the kernel it chose on this device (``default``: torch's
    own order); ``quantized_layers`` counts the UNet's FP8 linear layers; ``batch_sizes`` are
    the sizes a batch is padded to with CUDA graphs (empty without)."""

    scheduler: str = "default"
    compile: str = "off"
    compile_mode: str = "default"
    quantize: str = "none"
    quantized_layers: int = 0
    attention: str = "default"
    attention_backend: str = "default"
    batch_sizes: list[int] = Field(default_factory=list)
    channels_last: bool = False
    fuse_qkv: bool = False
    vae_slicing: bool = False
    vae_tiling: bool = False
    compiled_shapes: list[str] = Field(default_factory=list, description="Shapes (HxW:batch) "
                                       "warmed and served so far.")
    warmup: WarmupInfo | None = Field(None, description="How far the warm-up is, or how "
                                      "long it took (null before it starts).")
    compile_cache: CompileCacheInfo | None = Field(
        None, description="GENAUG_COMPILE_CACHE with compilation on: its folder, this "
                          "start's entry and what was found or saved.")
    unet_package: str = Field(
        "not used", description="The UNet as AOTInductor packages in the compile cache "
        "(GENAUG_COMPILE_PACKAGE): 'loaded 2 packages' (this start traced nothing), 'built 2 "
        "for the next start', or why not.")
    recompiles: int = Field(0, description="Graphs compiled after the warm-up (keep at 0).")
    adapter_swap: str = Field("resident", description="How LoRA adapters switch: resident "
                              "(flags on injected layers) or hotswap (copied into the "
                              "compiled UNet's one slot: never a recompile).")
    lora_max_rank: int | None = Field(None, description="The hotswap slot's rank.")


class ReplicaInfo(BaseModel):
    """Where this replica's pool lives, which part of the seed plan it takes, and its role
    (all, api or worker: ``GENAUG_ROLE``)."""

    partition: str | None = None
    pool_backend: str | None = None
    pregenerate: bool = True
    role: str = "all"


class InfoResponse(BaseModel):
    """``GET /v1/info``."""

    version: str
    ready: bool
    auth: bool
    model: ModelInfo | None
    device: DeviceInfo
    adapters: list[AdapterInfo]
    acceleration: AccelerationInfo
    speed: AccelerationInfo = Field(
        deprecated="`speed` is `acceleration` under its old name (the compile options; a "
                   "recipe's and a request's `speed` is the sampler mode); it goes in the next "
                   "release: read `acceleration`",
        description="Deprecated: the same object as `acceleration`, kept for one release.")
    turbo: TurboInfo | None = Field(
        None, description="What speed turbo draws with (null: this model serves no turbo; "
        "a model folder needs GENAUG_TURBO_LORA).")
    replica: ReplicaInfo
    limits: Limits


class HealthResponse(BaseModel):
    status: str
    detail: str | None = None


class SamplerInfo(BaseModel):
    """One sampler: its speed mode, scheduler, steps, guidance, its name as people read it
    and its id as the pool stores it (``speed:scheduler:steps:guidance``, then a turbo LoRA's
    kind and hash)."""

    speed: str
    scheduler: str
    steps: int
    guidance: float
    name: str
    id: str


class SamplingChoice(BaseModel):
    """How a recipe's pool is drawn. ``speed`` is the recipe's (quality, turbo, auto);
    ``state`` is ``fixed`` (quality, turbo), or auto's ``probing`` / ``decided``; ``sampler``
    the sampler drawing it (null while auto probes); ``reason`` why; ``cheaper`` the
    recipe sampler's UNet rows per image over the chosen one's; ``candidates`` auto's
    candidate set, cheapest first, each with what became of it."""

    speed: str
    state: str
    sampler: SamplerInfo | None
    reason: str
    cheaper: float | None = None
    candidates: list[dict[str, Any]] = Field(default_factory=list)
    since: float | None = Field(
        default=None, description="auto: when the probing began, or when it was decided "
        "(seconds since the epoch); null for a fixed sampler.")


class RecipeSummary(BaseModel):
    name: str
    description: str
    labels: list[str]
    pool_id: str
    capacity_per_label: int
    target_per_label: dict[str, int] = Field(
        description="The one target per label: the fill it is generated up to (the capacity "
        "on a pre-generating service; else what fill requests and waiting samples asked).")
    fill: dict[str, int]
    need: dict[str, float] = Field(
        default_factory=dict,
        description="The trainers' combined need per label (POST .../feedback): each "
        "client's report normalised, decayed and averaged; sums to at most 1.")
    need_clients: int = Field(default=0, description="Clients whose need still counts.")
    stopped: dict[str, str] = Field(
        default_factory=dict,
        description="Labels the planner stopped generating (the low-acceptance stop: the "
        "recipe's judge accepted under 10 % of a label's first 50 images judged since "
        "start-up), each with why and the fix.")
    sampling: SamplingChoice | None = Field(
        default=None, description="How the pool is drawn: the recipe's speed and sampler, "
        "or auto's decision with its reason (null: not known here).")


class RecipeList(BaseModel):
    recipes: list[RecipeSummary]


class FillBudget(BaseModel):
    """What ``POST /v1/recipes/{name}/fill`` with ``images`` does: ``requested`` images,
    ``asked`` of them planned (less when the labels have less room left), split as
    ``per_label`` by need and demand; they go before background pre-generation."""

    requested: int
    asked: int
    per_label: dict[str, int]
    note: str


class TurboInfo(SamplerInfo):
    """``speed: turbo`` as served: the sampler, the turbo LoRA's kind and file (null: the
    built-in model's own few-step setting)."""

    kind: str | None = None
    lora_file: str | None = None


class RecipeDetail(RecipeSummary):
    spec: dict[str, Any]
    spec_hash: str
    model_hash: str
    per_label: dict[str, dict[str, int]] = Field(
        description="Counts per label: fill (accepted images: the ones samples may return and "
        "targets count), generated, served, next_index, fill_served, reserved (in flight), "
        "asked (the fill asked for by fill requests and waiting samples, generated before "
        "background pre-generation; the target is target_per_label); curation: accepted "
        "(= fill), rejected (below the judge's min_score, not restored), rejected_by_person, "
        "and the lifetime judged_total and accepted_total (what the judge ever scored and "
        "kept).")
    totals: dict[str, int]
    generation_rate: float
    budget: FillBudget | None = Field(
        default=None, description="POST .../fill with images: what the budget does.")
    judge: dict[str, Any] | None = Field(
        default=None, description="The recipe's judge (rule, encoder, shots, min_score); "
        "null without one.")
    jobs: list[JobView] = Field(
        default_factory=list, description="The recipe's live fill jobs (queued, running).")


class FillResponse(RecipeDetail):
    """``POST /v1/recipes/{name}/fill``: the recipe's detail and the job the fill started."""

    job: JobRef


class FeedbackResponse(BaseModel):
    """``POST /v1/recipes/{name}/feedback``: the combined need the planner now weighs."""

    recipe: str
    client: str
    need: dict[str, float]
    need_clients: int


class VerdictResponse(BaseModel):
    """``POST /v1/recipes/{name}/verdicts``: what the verdict changed, and the label's counts
    now."""

    recipe: str
    label: str
    keep: bool
    changed: list[int] = Field(description="Seeds whose verdict changed.")
    unchanged: list[int] = Field(description="Seeds that already had this verdict.")
    accepted: int = Field(description="The label's accepted images now (its fill).")
    rejected: int = Field(description="Rejected by the judge, not restored.")
    rejected_by_person: int


class PoolImageInfo(BaseModel):
    """One image of a pool as the pool page lists it. ``seed`` is a 63-bit integer, which
    JavaScript reads with lost digits above 2**53: a browser uses ``seed_str`` or ``png``."""

    seed: int
    seed_str: str = Field(description="The seed as a decimal string, exact in any JSON "
                                      "reader (the verdicts route takes it as a seed).")
    score: float | None = Field(description="The judge's score; null: not judged.")
    created: float = Field(description="When it was stored (seconds since the epoch).")
    served: int = Field(description="How often samples returned it.")
    accepted: bool = Field(description="Whether samples may return it.")
    rejected_by: Literal["judge", "person"] | None = Field(
        description="Who rejected it (a person's verdict wins over the judge's); null: "
        "accepted.")
    verdict: Literal["reject", "restore"] | None = Field(
        description="A person's verdict, if any.")
    png: str = Field(description="Path of its pixels as a PNG (send the API key as for "
                                 "any route).")


class ImagePage(BaseModel):
    """``GET /v1/recipes/{name}/images``: one page of a label's accepted or rejected images,
    the least-scored first (unjudged last), then the oldest."""

    recipe: str
    label: str
    rejected: bool
    total: int = Field(description="Images of this kind the label holds.")
    offset: int
    limit: int
    accepted: int = Field(description="The label's accepted images (its fill).")
    rejected_by_judge: int
    rejected_by_person: int
    images: list[PoolImageInfo]


class ClientReport(BaseModel):
    """One client identity's use of the generator and of the recipe pools.

    A trainer that only samples pools has ``requests`` 0 and its ``samples`` counted."""

    client: str
    requests: int = Field(description="Generation requests admitted (for the pool client: "
                          "pre-generation batches).")
    images: int = Field(description="Images generated for it.")
    generation_s: float
    generation_share: float
    #: share of the generator's time over the last minute (0 when it did nothing then)
    share_last_minute: float = 0.0
    queued_images: int
    rejected: int
    dropped: int = Field(description="Requests given up (deadline passed or caller gone) "
                         "before they were answered, queued or in the pipeline.")
    failed: int
    samples: int = Field(0, description="Pool sample requests answered "
                         "(POST /v1/recipes/{name}/sample).")
    sampled_images: int = Field(0, description="Pool images served to it by those samples.")
    sampled_recipes: list[str] = Field(default_factory=list,
                                       description="The recipes it sampled, by name.")
    last_seen: float | None = Field(None, description="Unix time of its latest request "
                                    "(generation or sample); null for the pool client.")
    last_seen_ago_s: float | None = Field(None, description="Seconds since last_seen, by "
                                          "the service's clock (no skew with the reader's).")


class ClientsResponse(BaseModel):
    """``GET /v1/clients``: per identity (API key id and/or X-Client-Id, else the peer IP),
    every identity that generated or sampled since the service started."""

    clients: list[ClientReport]


class StatusResponse(BaseModel):
    """``GET /v1/status``: everything the status page shows, in one call."""

    info: InfoResponse
    queue_images: int
    paused_batches: int = Field(
        description="Batches stopped at a denoising step boundary for other work, waiting to "
        f"resume (at most {MAX_PAUSED})"
    )
    busy: bool
    uptime_s: float
    clients: list[ClientReport]
    throughput: list[dict[str, Any]]
    recipes: list[RecipeSummary]
    recent_images: int


GENERATE_ERRORS = error_responses(400, 413, 422, 429, 503, 504)
RECIPE_ERRORS = error_responses(400, 404, 413, 422, 503)
READ_ERRORS = error_responses()
