"""What the HTTP API answers: the response models, the error statuses each route documents,
and the encoding of image payloads off the event loop when they are large.

The request models are the intake's (:mod:`~genaug.service.intake.schemas`); these are the
answers, serialized by FastAPI and documented in ``/openapi.json``. Every non-2xx answer has
the one shape :class:`ErrorBody` (:class:`~genaug.service.errors.ApiError`).

Example::

    @router.get("/v1/clients", response_model=ClientsResponse, responses=READ_ERRORS)
    async def clients(request: Request) -> ClientsResponse: ...
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from ..batching.batcher import MAX_PAUSED

# Encode in the event loop below this many bytes of pixels (a thread hop costs more).
_INLINE_ENCODE_BYTES = 1 << 20


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


class SpeedInfo(BaseModel):
    """The speed options in force and the shapes compiled at warm-up."""

    scheduler: str = "default"
    compile: str = "off"
    channels_last: bool = False
    fuse_qkv: bool = False
    vae_slicing: bool = False
    vae_tiling: bool = False
    compiled_shapes: list[str] = Field(default_factory=list)


class ReplicaInfo(BaseModel):
    """Where this replica's pool lives and which part of the seed plan it takes."""

    partition: str | None = None
    pool_backend: str | None = None
    pregenerate: bool = True


class InfoResponse(BaseModel):
    """``GET /v1/info``."""

    version: str
    ready: bool
    auth: bool
    model: ModelInfo | None
    device: DeviceInfo
    adapters: list[AdapterInfo]
    speed: SpeedInfo
    replica: ReplicaInfo
    limits: Limits


class HealthResponse(BaseModel):
    status: str
    detail: str | None = None


class RecipeSummary(BaseModel):
    name: str
    description: str
    labels: list[str]
    pool_id: str
    capacity_per_label: int
    target_per_label: dict[str, int]
    fill: dict[str, int]
    need: dict[str, float] = Field(
        default_factory=dict,
        description="The trainers' combined need per label (POST .../feedback): each "
        "client's report normalised, decayed and averaged; sums to at most 1.")
    need_clients: int = Field(default=0, description="Clients whose need still counts.")


class RecipeList(BaseModel):
    recipes: list[RecipeSummary]


class RecipeDetail(RecipeSummary):
    spec: dict[str, Any]
    spec_hash: str
    model_hash: str
    per_label: dict[str, dict[str, int]]
    totals: dict[str, int]
    generation_rate: float


class FeedbackResponse(BaseModel):
    """``POST /v1/recipes/{name}/feedback``: the combined need the planner now weighs."""

    recipe: str
    client: str
    need: dict[str, float]
    need_clients: int


class ClientReport(BaseModel):
    """One client identity's use of the generator."""

    client: str
    requests: int
    images: int
    generation_s: float
    generation_share: float
    #: share of the generator's time over the last minute (0 when it did nothing then)
    share_last_minute: float = 0.0
    queued_images: int
    rejected: int
    dropped: int
    failed: int


class ClientsResponse(BaseModel):
    """``GET /v1/clients``: per identity (API key id and/or X-Client-Id, else the peer IP)."""

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
