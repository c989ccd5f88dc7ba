"""Request and response bodies of the HTTP API (pydantic, ``extra="forbid"``, explicit bounds).

Static bounds here are the ones no deployment would change (a side is a positive multiple
of 8, steps are positive). The bounds an operator sets (``max_side``, ``max_n`` ...) live in
:class:`~genaug.service.settings.Settings` and are checked by :func:`check_limits`, so a 422
names the setting that raises them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .errors import InvalidRequestError
from .settings import Settings

Priority = Literal["interactive", "bulk"]
SEED_MAX = 2**63 - 1


class GenerateRequest(BaseModel):
    """``POST /v1/generate``. Omitted size, steps and guidance take the service defaults.

    Example body::

        {"prompt": "depth image of a healing wound", "n": 4, "height": 64, "width": 64,
         "seed": 7}

    Image ``i`` uses seed ``seed + i`` (or a drawn seed); the seeds always come back.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: str = Field(min_length=1, description="What to draw.")
    negative_prompt: str | None = Field(default=None, description="What to avoid.")
    n: int = Field(default=1, ge=1, description="Number of images.")
    height: int | None = Field(default=None, ge=8, multiple_of=8, description="Generation height.")
    width: int | None = Field(default=None, ge=8, multiple_of=8, description="Generation width.")
    output_height: int | None = Field(default=None, ge=1, description="Resize output to this.")
    output_width: int | None = Field(default=None, ge=1, description="Resize output to this.")
    steps: int | None = Field(default=None, ge=1, description="Denoising steps.")
    guidance: float | None = Field(default=None, ge=0, le=50, allow_inf_nan=False)
    seed: int | None = Field(default=None, ge=0, le=SEED_MAX, description="Seed of image 0.")
    priority: Priority = Field(default="interactive", description="interactive before bulk.")
    timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @field_validator("guidance", "timeout_s", mode="before")
    @classmethod
    def _ints_are_numbers(cls, value: Any) -> Any:
        # strict mode refuses 5 for a float field; a JSON integer is a fine number here.
        if isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return value

    @field_validator("prompt")
    @classmethod
    def _prompt_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("prompt is blank; send some text to draw")
        return value

    @model_validator(mode="after")
    def _output_size_pairs(self) -> GenerateRequest:
        if (self.output_height is None) != (self.output_width is None):
            raise ValueError("output_height and output_width go together; give both or neither")
        return self


def check_limits(req: GenerateRequest, settings: Settings) -> None:
    """Raise :class:`InvalidRequestError` when ``req`` exceeds a bound the operator configured."""
    if len(req.prompt) > settings.max_prompt_chars:
        raise InvalidRequestError(
            f"prompt has {len(req.prompt)} characters, over max_prompt_chars "
            f"{settings.max_prompt_chars}; shorten it or set GENAUG_MAX_PROMPT_CHARS",
            field="prompt",
        )
    if req.negative_prompt is not None and len(req.negative_prompt) > settings.max_prompt_chars:
        raise InvalidRequestError(
            f"negative_prompt has {len(req.negative_prompt)} characters, over max_prompt_chars "
            f"{settings.max_prompt_chars}; shorten it or set GENAUG_MAX_PROMPT_CHARS",
            field="negative_prompt",
        )
    if req.n > settings.max_n:
        raise InvalidRequestError(
            f"n {req.n} exceeds max_n {settings.max_n}; request at most {settings.max_n} "
            "images per call (the client can loop) or set GENAUG_MAX_N",
            field="n",
        )
    for name in ("height", "width", "output_height", "output_width"):
        value = getattr(req, name)
        if value is not None and value > settings.max_side:
            raise InvalidRequestError(
                f"{name} {value} exceeds max_side {settings.max_side}; "
                "set GENAUG_MAX_SIDE or request a smaller size",
                field=name,
            )
    if req.steps is not None and req.steps > settings.max_steps:
        raise InvalidRequestError(
            f"steps {req.steps} exceeds max_steps {settings.max_steps}; "
            "set GENAUG_MAX_STEPS or request fewer steps",
            field="steps",
        )
    if req.timeout_s is not None and req.timeout_s > settings.max_timeout_s:
        raise InvalidRequestError(
            f"timeout_s {req.timeout_s} exceeds max_timeout_s {settings.max_timeout_s}; "
            "set GENAUG_MAX_TIMEOUT_S or wait less",
            field="timeout_s",
        )
    if req.seed is not None and req.seed + req.n - 1 > SEED_MAX:
        raise InvalidRequestError(
            f"seed {req.seed} + n {req.n} - 1 exceeds the largest seed {SEED_MAX}; "
            "use a smaller seed",
            field="seed",
        )


class ErrorDetail(BaseModel):
    type: str
    message: str
    field: str | None = None
    id: str | None = None


class ErrorBody(BaseModel):
    """The one error shape every non-2xx answer has."""

    error: ErrorDetail


class Limits(BaseModel):
    max_n: int
    max_side: int
    max_steps: int
    max_batch_images: int
    max_queue_images: int
    max_wait_ms: float
    max_prompt_chars: int
    max_timeout_s: float
    default_size: int
    default_steps: int
    default_guidance: float
    default_timeout_s: float


class ModelInfo(BaseModel):
    kind: str
    source: str
    weights_hash: str
    scheduler: str


class InfoResponse(BaseModel):
    """``GET /v1/info``."""

    version: str
    ready: bool
    model: ModelInfo | None
    device: str
    dtype: str
    limits: Limits
    auth: bool


class HealthResponse(BaseModel):
    status: str
    detail: str | None = None


class SampleRequest(BaseModel):
    """``POST /v1/recipes/{name}/sample``: images from the recipe's pool.

    Example body::

        {"labels": ["I", "P"], "n": 64, "wait_s": 2.0}
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    labels: str | list[str] | None = Field(
        default=None, description="One label, a list, or none for all of the recipe's labels."
    )
    n: int = Field(default=64, ge=0, description="Most images to return.")
    wait_s: float = Field(
        default=0.0, ge=0, allow_inf_nan=False,
        description="Wait up to this long for generation when the pool holds too few.",
    )

    @field_validator("wait_s", mode="before")
    @classmethod
    def _ints_are_numbers(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return value


class FillRequest(BaseModel):
    """``POST /v1/recipes/{name}/fill``: fill each label to at least ``per_label`` images."""

    model_config = ConfigDict(extra="forbid", strict=True)

    per_label: int = Field(ge=1)


class RecipeSummary(BaseModel):
    name: str
    description: str
    labels: list[str]
    pool_id: str
    capacity_per_label: int
    target_per_label: dict[str, int]
    fill: dict[str, int]


class RecipeList(BaseModel):
    recipes: list[RecipeSummary]


class RecipeDetail(RecipeSummary):
    spec: dict[str, Any]
    spec_hash: str
    model_hash: str
    per_label: dict[str, dict[str, int]]
    totals: dict[str, int]
    generation_rate: float


class ClientReport(BaseModel):
    """One client identity's use of the generator."""

    client: str
    requests: int
    images: int
    generation_s: float
    generation_share: float
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
    busy: bool
    uptime_s: float
    clients: list[ClientReport]
    throughput: list[dict[str, Any]]
    recipes: list[RecipeSummary]
    recent_images: int
