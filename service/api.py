"""HTTP routes and the one place errors become responses.

Every answer that is not a success has one shape, ``{"error": {"type", "message",
"field"?}}``; a 422 names the field, the value, the bound and the fix (messages are built in
:mod:`~genaug.service.errors`). Keys and body size are checked before any of this, by
:mod:`~genaug.service.guard`. Nothing a client can send produces a 500.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from genaug import __version__
from genaug.client.wire import (
    PNG_MEDIA_TYPE,
    SAFETENSORS_MEDIA_TYPE,
    encode_batch,
    encode_png_grid,
)

from .app import AppState
from .batcher import Batcher, Job
from .errors import (
    ApiError,
    DeadlineExceededError,
    InvalidRequestError,
    describe_validation,
    error_response,
    unparseable,
)
from .guard import GuardMiddleware
from .pregen import PoolManager, empty_images, unknown_recipe
from .schemas import (
    ClientReport,
    ClientsResponse,
    ErrorBody,
    FillRequest,
    GenerateRequest,
    HealthResponse,
    InfoResponse,
    Limits,
    ModelInfo,
    RecipeDetail,
    RecipeList,
    RecipeSummary,
    SampleRequest,
    StatusResponse,
    check_limits,
)
from .work import GroupKey, Item

log = logging.getLogger(__name__)

STATUS_PAGE = Path(__file__).parent / "static" / "status.html"
_CLIENT_ID = re.compile(r"^[A-Za-z0-9._:@/-]{1,64}$")
def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses a route answers, all with the one error shape.

    401 is listed everywhere but the open paths: it is what any route answers when API keys
    are configured and the request has none.
    """
    return {code: {"model": ErrorBody} for code in (401, *codes)}


GENERATE_ERRORS = _errors(400, 413, 422, 429, 503, 504)
RECIPE_ERRORS = _errors(400, 404, 413, 422, 503)
READ_ERRORS = _errors()


# -- dependencies ---------------------------------------------------------------------------


def get_state(request: Request) -> AppState:
    state: AppState = request.state.genaug
    return state


StateDep = Annotated[AppState, Depends(get_state)]


def client_identity(request: Request, state: StateDep) -> str:
    """Who is asking, for round-robin fairness: the API key's id and/or ``X-Client-Id``."""
    given = request.headers.get("x-client-id")
    if given is not None and not _CLIENT_ID.match(given):
        raise InvalidRequestError(
            f"X-Client-Id {given[:80]!r} is not 1-64 characters of letters, digits and "
            "'._:@/-'; send a short name such as 'trainer-a'",
            field="X-Client-Id",
        )
    key = getattr(request.state, "key_id", None)
    if key and given:
        return f"{key}/{given}"
    if key:
        return str(key)
    if given:
        return given
    host = request.client.host if request.client else "unknown"
    return f"ip:{host}"


ClientDep = Annotated[str, Depends(client_identity)]


# -- routes ---------------------------------------------------------------------------------

router = APIRouter()


@router.get("/healthz", response_model=HealthResponse, tags=["probes"])
async def healthz() -> HealthResponse:
    """Liveness: the process answers."""
    return HealthResponse(status="ok")


@router.get(
    "/readyz",
    response_model=HealthResponse,
    responses={503: {"model": HealthResponse}},
    tags=["probes"],
)
async def readyz(state: StateDep) -> Response:
    """Readiness: 200 only once the model is loaded and warmed up."""
    if state.ready:
        return JSONResponse(HealthResponse(status="ready").model_dump())
    detail = state.load_error or "loading"
    return JSONResponse(
        HealthResponse(status="not_ready", detail=detail).model_dump(), status_code=503
    )


@router.get("/v1/info", response_model=InfoResponse, tags=["service"], responses=READ_ERRORS)
async def info(state: StateDep) -> InfoResponse:
    """Model identity, device, dtype, limits and version."""
    s = state.settings
    size, steps, guidance = state.defaults()
    model = None
    if state.model is not None:
        model = ModelInfo(
            kind=state.model.kind,
            source=state.model.source,
            weights_hash=state.model.weights_hash,
            scheduler=type(getattr(state.model.pipeline, "scheduler", None)).__name__,
        )
    return InfoResponse(
        version=__version__,
        ready=state.ready,
        model=model,
        device=state.device,
        dtype=state.dtype,
        auth=bool(s.api_keys),
        limits=Limits(
            max_n=s.max_n,
            max_side=s.max_side,
            max_steps=s.max_steps,
            max_batch_images=s.max_batch_images,
            max_queue_images=s.max_queue_images,
            max_wait_ms=s.max_wait_ms,
            max_prompt_chars=s.max_prompt_chars,
            max_timeout_s=s.max_timeout_s,
            default_size=size,
            default_steps=steps,
            default_guidance=guidance,
            default_timeout_s=s.request_timeout_s,
        ),
    )


@router.get("/metrics", response_class=PlainTextResponse, tags=["service"],
            responses=READ_ERRORS)
async def metrics(state: StateDep) -> Response:
    """Prometheus text format."""
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")


def plan_items(req: GenerateRequest, state: AppState) -> tuple[GroupKey, list[Item]]:
    """Resolve defaults and seeds: the exact work a request stands for."""
    size, steps, guidance = state.defaults()
    height = req.height or size
    width = req.width or size
    key = GroupKey(height=height, width=width, steps=req.steps or steps)
    if req.seed is not None:
        seeds = [req.seed + i for i in range(req.n)]
    else:
        seeds = [int(s) for s in np.random.default_rng().integers(0, 2**63 - 1, size=req.n)]
    item_guidance = req.guidance if req.guidance is not None else guidance
    output_height = req.output_height or height
    output_width = req.output_width or width
    items = [
        Item(
            req.prompt,
            seed=seed,
            guidance=item_guidance,
            output_height=output_height,
            output_width=output_width,
            negative_prompt=req.negative_prompt,
        )
        for seed in seeds
    ]
    return key, items


async def _until_disconnect(request: Request) -> None:
    # After the body is read, the next ASGI message is http.disconnect when the client goes.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def wait_for_job(job: Job, batcher: Batcher, request: Request) -> np.ndarray | None:
    """The job's images; ``None`` if the client went away; 504 past the deadline."""
    result = asyncio.ensure_future(job.result())
    gone = asyncio.ensure_future(_until_disconnect(request))
    try:
        timeout = max(0.0, job.deadline - time.monotonic())
        done, _ = await asyncio.wait(
            {result, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        gone.cancel()
    if result in done:
        return result.result()
    result.cancel()
    if gone in done:
        batcher.forget(job, "disconnected")
        return None
    batcher.forget(job, "expired")
    raise DeadlineExceededError(
        f"request {job.id} did not finish within its timeout_s; raise timeout_s, ask for "
        "fewer images, or retry when the queue is shorter"
    )


def wants_png(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return PNG_MEDIA_TYPE in accept and SAFETENSORS_MEDIA_TYPE not in accept


@router.post(
    "/v1/generate",
    tags=["generation"],
    responses={
        200: {
            "content": {SAFETENSORS_MEDIA_TYPE: {}, PNG_MEDIA_TYPE: {}},
            "description": "safetensors batch (images uint8 [n,h,w,3], seeds int64 [n]) "
            "or, with Accept: image/png, one PNG (a grid when n > 1)",
        },
        **GENERATE_ERRORS,
    },
)
async def generate(
    body: GenerateRequest, request: Request, state: StateDep, client: ClientDep
) -> Response:
    """Generate ``n`` images; batched with other requests of the same size and steps."""
    started = time.monotonic()
    check_limits(body, state.settings)
    batcher = state.require_batcher()
    key, items = plan_items(body, state)
    timeout = body.timeout_s or state.settings.request_timeout_s
    job = batcher.submit(key, items, client=client, priority=body.priority, timeout_s=timeout)
    images = await wait_for_job(job, batcher, request)
    if images is None:
        return Response(status_code=499)  # client closed the connection; nobody reads this
    seeds = np.array([item.seed for item in items], dtype=np.int64)
    if wants_png(request):
        payload = await asyncio.to_thread(encode_png_grid, images)
        media = PNG_MEDIA_TYPE
    else:
        metadata = {
            "request": body.model_dump(mode="json"),
            "resolved": {
                "height": key.height,
                "width": key.width,
                "steps": key.steps,
                "guidance": items[0].guidance,
                "output_height": items[0].output_height,
                "output_width": items[0].output_width,
            },
            "model_hash": state.model.weights_hash if state.model else "",
            "genaug_version": __version__,
        }
        encode = _encode_call(images, seeds, metadata)
        payload = await asyncio.to_thread(encode) if images.nbytes > 1 << 20 else encode()
        media = SAFETENSORS_MEDIA_TYPE
    state.metrics.request_latency.labels("generate").observe(time.monotonic() - started)
    return Response(payload, media_type=media, headers={"X-Genaug-Seeds": _seed_header(seeds)})


def _encode_call(
    images: np.ndarray, seeds: np.ndarray, metadata: dict[str, Any]
) -> Callable[[], bytes]:
    return lambda: encode_batch(images, seeds, metadata=metadata)


def _seed_header(seeds: np.ndarray) -> str:
    text = ",".join(str(int(s)) for s in seeds[:16])
    return text + (",..." if len(seeds) > 16 else "")


# -- sharing and status ---------------------------------------------------------------------


def client_reports(state: AppState) -> list[ClientReport]:
    batcher = state.batcher
    if batcher is None:
        return []
    queued = batcher.queued_by_client()
    total = sum(c.generation_s for c in batcher.clients.values()) or 1.0
    names = sorted(set(batcher.clients) | set(queued))
    reports = []
    for name in names:
        c = batcher.clients.get(name)
        reports.append(ClientReport(
            client=name,
            requests=c.requests if c else 0,
            images=c.images if c else 0,
            generation_s=round(c.generation_s, 4) if c else 0.0,
            generation_share=round(c.generation_s / total, 4) if c else 0.0,
            queued_images=queued.get(name, 0),
            rejected=c.rejected if c else 0,
            dropped=c.dropped if c else 0,
            failed=c.failed if c else 0,
        ))
    return reports


@router.get("/v1/clients", response_model=ClientsResponse, tags=["service"],
            responses=READ_ERRORS)
async def clients(state: StateDep) -> ClientsResponse:
    """Per client identity: requests, images, share of generation time, queue, rejections."""
    return ClientsResponse(clients=client_reports(state))


@router.get("/v1/status", response_model=StatusResponse, tags=["service"],
            responses=READ_ERRORS)
async def status(state: StateDep) -> StatusResponse:
    """What the status page shows: model, readiness, queue per client, throughput, pools."""
    batcher = state.batcher
    recipes: list[RecipeSummary] = []
    if state.pools is not None:
        pools = state.pools
        recipes = await asyncio.to_thread(
            lambda: [RecipeSummary(**pools.summary(name)) for name in state.recipes]
        )
    return StatusResponse(
        info=await info(state),
        queue_images=batcher.queued_images if batcher else 0,
        busy=batcher.busy if batcher else False,
        uptime_s=round(time.time() - state.started_at, 1),
        clients=client_reports(state),
        throughput=batcher.throughput() if batcher else [],
        recipes=recipes,
        recent_images=len(batcher.recent) if batcher else 0,
    )


@router.get(
    "/v1/recent.png",
    tags=["service"],
    responses={200: {"content": {PNG_MEDIA_TYPE: {}}, "description": "a grid PNG"},
               204: {"description": "nothing generated yet"}, **READ_ERRORS},
)
async def recent_png(state: StateDep) -> Response:
    """The most recently generated images (requests and pools) as one grid PNG."""
    batcher = state.batcher
    if batcher is None or not batcher.recent:
        return Response(status_code=204)
    images = list(batcher.recent)
    shape = images[-1].shape
    same = np.stack([im for im in images if im.shape == shape])
    payload = await asyncio.to_thread(encode_png_grid, same)
    return Response(payload, media_type=PNG_MEDIA_TYPE, headers={"Cache-Control": "no-store"})


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def status_page() -> HTMLResponse:
    """The self-contained status page (no CDN; refreshes itself)."""
    return HTMLResponse(STATUS_PAGE.read_text(encoding="utf-8"))


# -- recipes and pools ----------------------------------------------------------------------

@router.get("/v1/recipes", response_model=RecipeList, tags=["recipes"],
            responses=_errors(503))
async def list_recipes(state: StateDep) -> RecipeList:
    """Recipes with their pools' fill per label (empty when no recipes are configured)."""
    if not state.recipes:
        return RecipeList(recipes=[])
    pools = state.require_pools()
    summaries = await asyncio.to_thread(
        lambda: [RecipeSummary(**pools.summary(name)) for name in state.recipes]
    )
    return RecipeList(recipes=summaries)


@router.get(
    "/v1/recipes/{name}", response_model=RecipeDetail, tags=["recipes"],
    responses=RECIPE_ERRORS,
)
async def recipe_detail(name: str, state: StateDep) -> RecipeDetail:
    """Spec, pool identity, per-label fill, generated and served totals, generation rate."""
    pools = _pools_for(state, name)
    return RecipeDetail(**await asyncio.to_thread(pools.detail, name))


def _pools_for(state: AppState, name: str) -> PoolManager:
    if name not in state.recipes:
        raise unknown_recipe(name, state.recipes)
    return state.require_pools()


@router.post(
    "/v1/recipes/{name}/sample",
    tags=["recipes"],
    responses={
        200: {
            "content": {SAFETENSORS_MEDIA_TYPE: {}},
            "description": "safetensors batch: images uint8 [k,h,w,3], labels int32 [k] "
            "(indices into the label_names metadata), seeds int64 [k]; k <= n",
        },
        **RECIPE_ERRORS,
    },
)
async def sample(name: str, body: SampleRequest, state: StateDep) -> Response:
    """Up to ``n`` pre-generated images spread over ``labels``, at once (or after up to
    ``wait_s`` of generation). The count returned is explicit; none is not an error."""
    started = time.monotonic()
    pools = _pools_for(state, name)
    limit = state.settings.max_sample_n
    if body.n > limit:
        raise InvalidRequestError(
            f"n {body.n} exceeds max_sample_n {limit}; sample in several calls or set "
            "GENAUG_MAX_SAMPLE_N", field="n",
        )
    if body.wait_s > state.settings.max_timeout_s:
        raise InvalidRequestError(
            f"wait_s {body.wait_s} exceeds max_timeout_s {state.settings.max_timeout_s}; wait "
            "less or set GENAUG_MAX_TIMEOUT_S", field="wait_s",
        )
    recipe = pools.recipe(name)
    labels = pools.resolve_labels(recipe, body.labels)
    result, recipe = await pools.sample(name, labels, body.n, body.wait_s)
    images = result.images if len(result) else empty_images(recipe)
    payload = await asyncio.to_thread(
        encode_batch,
        images,
        result.seeds,
        labels=result.label_indices(recipe.label_names),
        metadata={
            "recipe": name,
            "label_names": recipe.label_names,
            "pool_id": pools.pool_ids[name],
            "requested": body.n,
            "returned": len(result),
            "genaug_version": __version__,
        },
    )
    state.metrics.request_latency.labels("sample").observe(time.monotonic() - started)
    return Response(payload, media_type=SAFETENSORS_MEDIA_TYPE,
                    headers={"X-Genaug-Count": str(len(result))})


@router.post(
    "/v1/recipes/{name}/fill", response_model=RecipeDetail, tags=["recipes"],
    responses=RECIPE_ERRORS,
)
async def fill(name: str, body: FillRequest, state: StateDep) -> RecipeDetail:
    """Fill every label of the recipe to at least ``per_label`` images (in the background,
    when no request waits); answers at once with the current counts."""
    pools = _pools_for(state, name)
    await asyncio.to_thread(pools.raise_target, name, body.per_label)
    return RecipeDetail(**await asyncio.to_thread(pools.detail, name))


# -- installation ---------------------------------------------------------------------------


def install(app: FastAPI, state: AppState) -> None:
    """Add routes, error handlers and middleware to ``app``."""
    # Named in unknown-field messages, by the route's body model.
    allowed = {
        "generate": sorted(GenerateRequest.model_fields),
        "sample": sorted(SampleRequest.model_fields),
        "fill": sorted(FillRequest.model_fields),
    }

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        if isinstance(exc, InvalidRequestError):
            state.metrics.rejections.labels("invalid").inc()
        return error_response(exc)

    async def validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        state.metrics.rejections.labels("invalid").inc()
        route = request.url.path.rsplit("/", 1)[-1]
        fields = allowed.get(route, allowed["generate"])
        return error_response(describe_validation(list(exc.errors()), fields))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 400 and exc.__cause__ is not None:
            # FastAPI's body reader: the body is not UTF-8 JSON it can parse.
            state.metrics.rejections.labels("invalid").inc()
            return error_response(InvalidRequestError(unparseable(exc.__cause__)), status=400)
        kinds = {404: "not_found", 405: "method_not_allowed"}
        body = {
            "error": {
                "type": kinds.get(exc.status_code, "http_error"),
                "message": f"{request.method} {request.url.path}: {exc.detail}",
            }
        }
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    async def unexpected(request: Request, exc: Exception) -> Response:
        error_id = uuid.uuid4().hex[:12]
        log.exception("unexpected error (error id %s) on %s", error_id, request.url.path)
        body = {
            "error": {
                "type": "internal",
                "id": error_id,
                "message": f"internal error; error id {error_id} is in the log",
            }
        }
        return JSONResponse(body, status_code=500)

    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        ApiError: api_error,
        RequestValidationError: validation_error,
        StarletteHTTPException: http_error,
        Exception: unexpected,
    }
    for exc_class, handler in handlers.items():
        app.add_exception_handler(exc_class, handler)
    app.include_router(router)
    app.add_middleware(GuardMiddleware, state=state)
    if state.settings.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=state.settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "X-API-Key", "X-Client-Id", "Content-Type"],
        )
