"""HTTP routes and the one place errors become responses.

Every handler reads the app's state from one place, ``request.state.genaug``
(:class:`~genaug.service.api.state.AppState`), and parses its body with the app's own request
models (:mod:`~genaug.service.intake.schemas`), the same models ``/openapi.json`` documents
(:mod:`~genaug.service.api.openapi`).

Every answer that is not a success has one shape, ``{"error": {"type", "message",
"field"?}}``; a 422 names the field, the value, the bound and the fix. Keys and body size are
checked before any of this, by :mod:`~genaug.service.api.guard`. Nothing a client can send
produces a 500.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from genaug import __version__
from genaug.client.wire import (
    PNG_MEDIA_TYPE,
    SAFETENSORS_MEDIA_TYPE,
    encode_batch,
    encode_png_grid,
)

from ..batching.batcher import Batcher, Job
from ..errors import (
    ApiError,
    DeadlineExceededError,
    InvalidRequestError,
    describe_validation,
    error_response,
    new_id,
    parse_json,
)
from ..intake.plan import plan_items, plan_variants
from ..intake.schemas import (
    MIN_TIMEOUT_S,
    AdapterInfo,
    ClientReport,
    ClientsResponse,
    DeviceInfo,
    ErrorBody,
    HealthResponse,
    InfoResponse,
    Limits,
    ModelInfo,
    RecipeDetail,
    RecipeList,
    RecipeSummary,
    ReplicaInfo,
    SpeedInfo,
    StatusResponse,
)
from ..intake.uploads import read_upload
from ..pool.planner import PoolManager, empty_images, unknown_recipe
from ..recipes.spec import source_hash
from .state import AppState

log = logging.getLogger(__name__)

STATUS_PAGE = Path(__file__).parents[1] / "static" / "status.html"
CLIENT_ID_PATTERN = r"^[A-Za-z0-9._:@/-]{1,64}$"
_CLIENT_ID = re.compile(CLIENT_ID_PATTERN)
# Encode in the event loop below this many bytes of pixels (a thread hop costs more).
_INLINE_ENCODE_BYTES = 1 << 20

B = TypeVar("B", bound=BaseModel)


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses a route answers, all with the one error shape.

    401 is listed everywhere but the open paths: it is what any route answers when API keys
    are configured and the request has none.
    """
    return {code: {"model": ErrorBody} for code in (401, *codes)}


GENERATE_ERRORS = _errors(400, 413, 422, 429, 503, 504)
RECIPE_ERRORS = _errors(400, 404, 413, 422, 503)
READ_ERRORS = _errors()


def state_of(request: Request) -> AppState:
    """The app's state: the one place handlers read it from."""
    state: AppState = request.state.genaug
    return state


async def read_body(request: Request, model: type[B], hints: Mapping[str, str]) -> B:
    """Parse the JSON body with ``model`` (:func:`~genaug.service.errors.parse_json`): 422
    saying why it is not JSON, or naming the field, value, bound and fix."""
    return parse_json(model, await request.body(), hints)


def client_identity(request: Request) -> str:
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
async def readyz(request: Request) -> Response:
    """Readiness: 200 only once the model is loaded and warmed up."""
    state = state_of(request)
    if state.ready:
        return JSONResponse(HealthResponse(status="ready").model_dump())
    detail = state.load_error or "loading"
    return JSONResponse(
        HealthResponse(status="not_ready", detail=detail).model_dump(), status_code=503
    )


def info_of(state: AppState) -> InfoResponse:
    """What ``GET /v1/info`` answers, grouped: model, device, adapters, speed, replica, limits."""
    s = state.settings
    size, steps, guidance = state.defaults()
    model = None
    if state.model is not None:
        model = ModelInfo(
            kind=state.model.kind,
            source=state.model.source,
            hash=state.model.weights_hash,
            dtype=str(state.model.dtype).removeprefix("torch."),
            trained_on=getattr(state.model, "trained_on", None),
        )
    device = {k: v for k, v in state.device_info.items() if k in DeviceInfo.model_fields}
    return InfoResponse(
        version=__version__,
        ready=state.ready,
        auth=bool(s.api_keys),
        model=model,
        device=DeviceInfo(**device) if device else DeviceInfo(name=s.device, type="unknown"),
        adapters=[AdapterInfo(**a) for a in state.adapters_info],
        speed=SpeedInfo(**state.speed_info),
        replica=ReplicaInfo(**state.replica_info),
        limits=Limits(
            max_n=s.max_n,
            max_side=s.max_side,
            max_steps=s.max_steps,
            max_batch_images=s.max_batch_images,
            max_queue_images=s.max_queue_images,
            max_wait_ms=s.max_wait_ms,
            max_prompt_chars=s.max_prompt_chars,
            max_timeout_s=s.max_timeout_s,
            min_timeout_s=MIN_TIMEOUT_S,
            max_sample_n=s.max_sample_n,
            max_body_bytes=s.max_body_bytes,
            max_upload_bytes=s.max_upload_bytes,
            max_variant_sources=s.max_variant_sources,
            default_size=size,
            default_steps=steps,
            default_guidance=guidance,
            default_timeout_s=s.request_timeout_s,
        ),
    )


@router.get("/v1/info", response_model=InfoResponse, tags=["service"], responses=READ_ERRORS)
async def info(request: Request) -> InfoResponse:
    """Model, device, adapters, speed options, replica, limits and version."""
    return info_of(state_of(request))


@router.get("/metrics", response_class=PlainTextResponse, tags=["service"],
            responses=READ_ERRORS)
async def metrics(request: Request) -> Response:
    """Prometheus text format."""
    return Response(state_of(request).metrics.render(), media_type="text/plain; version=0.0.4")


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


async def encoded(images: np.ndarray, encode: Callable[[], bytes]) -> bytes:
    """Run ``encode`` inline for small batches, in a thread for large ones."""
    if images.nbytes > _INLINE_ENCODE_BYTES:
        return await asyncio.to_thread(encode)
    return encode()


@router.post(
    "/v1/generate",
    tags=["generation"],
    responses={
        200: {
            "content": {SAFETENSORS_MEDIA_TYPE: {}, PNG_MEDIA_TYPE: {}},
            "description": "safetensors batch (images uint8 [n,h,w,c], seeds int64 [n]) "
            "or, with Accept: image/png, one PNG (a grid when n > 1)",
        },
        **GENERATE_ERRORS,
    },
)
async def generate(request: Request) -> Response:
    """Generate ``n`` images; batched with other requests of the same size and steps."""
    started = time.monotonic()
    state = state_of(request)
    body = await read_body(request, state.api.generate, state.api.hints["generate"])
    client = client_identity(request)
    batcher = state.require_batcher()
    key, items = plan_items(body, state.defaults())
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
                "scheduler": key.scheduler,
            },
            "model_hash": state.model.weights_hash if state.model else "",
            "genaug_version": __version__,
        }
        payload = await encoded(images, lambda: encode_batch(images, seeds, metadata=metadata))
        media = SAFETENSORS_MEDIA_TYPE
    state.metrics.request_latency.labels("generate").observe(time.monotonic() - started)
    return Response(payload, media_type=media, headers={"X-Genaug-Seeds": _seed_header(seeds)})


@router.post(
    "/v1/variants",
    tags=["generation"],
    responses={
        200: {
            "content": {SAFETENSORS_MEDIA_TYPE: {}, PNG_MEDIA_TYPE: {}},
            "description": "safetensors batch (images uint8 [n,h,w,c], seeds int64 [n], "
            "sources int32 [n]: the source each variant came from, source-major) or, with "
            "Accept: image/png, one PNG grid",
        },
        **GENERATE_ERRORS,
    },
)
async def variants(request: Request) -> Response:
    """img2img variants of the uploaded sources (Real Guidance / DA-Fusion): ``n_per_image``
    each, ``strength`` of the schedule run from the noised source."""
    started = time.monotonic()
    state = state_of(request)
    settings = state.settings
    upload = await read_upload(
        request, state.api.variants, state.api.hints["variants"],
        max_sources=settings.max_variant_sources, max_side=settings.max_side,
    )
    client = client_identity(request)
    batcher = state.require_batcher()
    key, items, sources = plan_variants(upload, state.defaults())
    params = upload.params
    timeout = params.timeout_s or settings.request_timeout_s
    job = batcher.submit(key, items, client=client, priority=params.priority, timeout_s=timeout)
    images = await wait_for_job(job, batcher, request)
    if images is None:
        return Response(status_code=499)
    seeds = np.array([item.seed for item in items], dtype=np.int64)
    if wants_png(request):
        payload = await asyncio.to_thread(encode_png_grid, images)
        media = PNG_MEDIA_TYPE
    else:
        metadata = {
            "request": params.model_dump(mode="json"),
            "resolved": {"height": key.height, "width": key.width, "steps": key.steps,
                         "strength": key.strength, "guidance": items[0].guidance,
                         "scheduler": key.scheduler},
            "source_hashes": [source_hash(s) for s in upload.sources],
            "model_hash": state.model.weights_hash if state.model else "",
            "genaug_version": __version__,
        }
        payload = await encoded(images, lambda: encode_batch(
            images, seeds, sources=sources, metadata=metadata))
        media = SAFETENSORS_MEDIA_TYPE
    state.metrics.request_latency.labels("variants").observe(time.monotonic() - started)
    return Response(payload, media_type=media, headers={"X-Genaug-Seeds": _seed_header(seeds)})


def _seed_header(seeds: np.ndarray) -> str:
    text = ",".join(str(int(s)) for s in seeds[:16])
    return text + (",..." if len(seeds) > 16 else "")


# -- sharing and status ---------------------------------------------------------------------


def client_reports(state: AppState) -> list[ClientReport]:
    batcher = state.batcher
    if batcher is None:
        return []
    queued = batcher.queue.by_client()
    clients = batcher.activity.clients
    total = sum(c.generation_s for c in clients.values()) or 1.0
    reports = []
    for name in sorted(set(clients) | set(queued)):
        c = clients.get(name)
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
async def clients(request: Request) -> ClientsResponse:
    """Per client identity: requests, images, share of generation time, queue, rejections."""
    return ClientsResponse(clients=client_reports(state_of(request)))


@router.get("/v1/status", response_model=StatusResponse, tags=["service"],
            responses=READ_ERRORS)
async def status(request: Request) -> StatusResponse:
    """What the status page shows: model, readiness, queue per client, throughput, pools."""
    state = state_of(request)
    batcher = state.batcher
    recipes: list[RecipeSummary] = []
    if state.pools is not None:
        pools = state.pools
        recipes = await asyncio.to_thread(
            lambda: [RecipeSummary(**pools.summary(name)) for name in state.recipes]
        )
    return StatusResponse(
        info=info_of(state),
        queue_images=batcher.queued_images if batcher else 0,
        busy=batcher.busy if batcher else False,
        uptime_s=round(time.time() - state.started_at, 1),
        clients=client_reports(state),
        throughput=batcher.activity.throughput() if batcher else [],
        recipes=recipes,
        recent_images=len(batcher.activity.recent) if batcher else 0,
    )


@router.get(
    "/v1/recent.png",
    tags=["service"],
    responses={200: {"content": {PNG_MEDIA_TYPE: {}}, "description": "a grid PNG"},
               204: {"description": "nothing generated yet"}, **READ_ERRORS},
)
async def recent_png(request: Request) -> Response:
    """The most recently generated images (requests and pools) as one grid PNG."""
    batcher = state_of(request).batcher
    if batcher is None or not batcher.activity.recent:
        return Response(status_code=204)
    images = list(batcher.activity.recent)
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
async def list_recipes(request: Request) -> RecipeList:
    """Recipes with their pools' fill per label (empty when no recipes are configured)."""
    state = state_of(request)
    if not state.recipes:
        return RecipeList(recipes=[])
    pools = state.require_pools()
    summaries = await asyncio.to_thread(
        lambda: [RecipeSummary(**pools.summary(name)) for name in state.recipes]
    )
    return RecipeList(recipes=summaries)


def _pools_for(state: AppState, name: str) -> PoolManager:
    if name not in state.recipes:
        raise unknown_recipe(name, state.recipes)
    return state.require_pools()


@router.get(
    "/v1/recipes/{name}", response_model=RecipeDetail, tags=["recipes"],
    responses=RECIPE_ERRORS,
)
async def recipe_detail(name: str, request: Request) -> RecipeDetail:
    """Spec, pool identity, per-label fill, generated and served totals, generation rate."""
    pools = _pools_for(state_of(request), name)
    return RecipeDetail(**await asyncio.to_thread(pools.detail, name))


@router.post(
    "/v1/recipes/{name}/sample",
    tags=["recipes"],
    responses={
        200: {
            "content": {SAFETENSORS_MEDIA_TYPE: {}},
            "description": "safetensors batch: images uint8 [k,h,w,c], labels int32 [k] "
            "(indices into the label_names metadata), seeds int64 [k]; k <= n",
        },
        **RECIPE_ERRORS,
    },
)
async def sample(name: str, request: Request) -> Response:
    """Up to ``n`` pre-generated images spread over ``labels``, at once (or after up to
    ``wait_s`` of generation). The count returned is explicit; none is not an error."""
    started = time.monotonic()
    state = state_of(request)
    pools = _pools_for(state, name)
    body = await read_body(request, state.api.sample[name], state.api.hints["sample"])
    recipe = pools.recipe(name)
    labels = pools.resolve_labels(recipe, body.labels)
    result, recipe = await pools.sample(name, labels, body.n, body.wait_s)
    images = result.images if len(result) else empty_images(recipe)
    metadata = {
        "recipe": name,
        "label_names": recipe.label_names,
        "pool_id": pools.pool_ids[name],
        "requested": body.n,
        "returned": len(result),
        "genaug_version": __version__,
    }
    if result.sources is not None and any(result.sources):
        # img2img variants: which real image each came from (hash of its pixels; None for
        # text-to-image labels), as /v1/variants answers source_hashes.
        metadata["source_hashes"] = list(result.sources)
    payload = await encoded(images, lambda: encode_batch(
        images, result.seeds, labels=result.label_indices(recipe.label_names), metadata=metadata
    ))
    state.metrics.request_latency.labels("sample").observe(time.monotonic() - started)
    return Response(payload, media_type=SAFETENSORS_MEDIA_TYPE,
                    headers={"X-Genaug-Count": str(len(result))})


@router.post(
    "/v1/recipes/{name}/fill", response_model=RecipeDetail, tags=["recipes"],
    responses=RECIPE_ERRORS,
)
async def fill(name: str, request: Request) -> RecipeDetail:
    """Fill every label of the recipe to at least ``per_label`` images (in the background,
    when no request waits); answers at once with the current counts."""
    state = state_of(request)
    pools = _pools_for(state, name)
    body = await read_body(request, state.api.fill[name], state.api.hints["fill"])
    await asyncio.to_thread(pools.raise_target, name, body.per_label)
    return RecipeDetail(**await asyncio.to_thread(pools.detail, name))


# -- errors ---------------------------------------------------------------------------------


async def api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    if isinstance(exc, InvalidRequestError):
        state_of(request).metrics.rejections.labels("invalid").inc()
    return error_response(exc)


async def validation_error(request: Request, exc: Exception) -> Response:
    """A path or query parameter FastAPI itself validated (bodies are parsed by the routes)."""
    assert isinstance(exc, RequestValidationError)
    state_of(request).metrics.rejections.labels("invalid").inc()
    return error_response(describe_validation(list(exc.errors()), [], {}))


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    kinds = {404: "not_found", 405: "method_not_allowed"}
    body = {
        "error": {
            "type": kinds.get(exc.status_code, "http_error"),
            "message": f"{request.method} {request.url.path}: {exc.detail}",
        }
    }
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def unexpected(request: Request, exc: Exception) -> Response:
    error_id = new_id()
    log.exception("unexpected error (error id %s) on %s", error_id, request.url.path)
    body = {
        "error": {
            "type": "internal",
            "id": error_id,
            "message": f"internal error; error id {error_id} is in the log",
        }
    }
    return JSONResponse(body, status_code=500)


EXCEPTION_HANDLERS: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
    ApiError: api_error,
    RequestValidationError: validation_error,
    StarletteHTTPException: http_error,
    Exception: unexpected,
}


# -- the hot path ---------------------------------------------------------------------------


class DirectSample:
    """Serves ``POST /v1/recipes/{name}/sample`` straight from the ASGI call, past Starlette's
    router and FastAPI's dependency solving (about 0.1 ms of a pool sample's ~1 ms in the
    service). A pure ASGI middleware inside :class:`~genaug.service.api.guard.GuardMiddleware`:
    keys and body limits are checked before it. Every other request, and any path it does
    not recognise exactly, goes on to the app; the FastAPI route stays registered, and
    documents the operation in ``/openapi.json``. Errors take the app's handlers:
    :class:`~genaug.service.errors.ApiError` here (the same :func:`api_error`), anything
    unexpected propagates to the app's 500 handler.

    Example::

        app.add_middleware(DirectSample)   # before GuardMiddleware, so the guard runs first
    """

    PREFIX, SUFFIX = "/v1/recipes/", "/sample"

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = self._recipe(scope)
        if name is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response = await sample(name, request)
        except ApiError as exc:
            response = await api_error(request, exc)
        await response(scope, receive, send)

    def _recipe(self, scope: Scope) -> str | None:
        """The recipe name when ``scope`` is exactly the sample route, else ``None``."""
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            return None
        path: str = scope["path"]
        if not (path.startswith(self.PREFIX) and path.endswith(self.SUFFIX)):
            return None
        name = path[len(self.PREFIX) : -len(self.SUFFIX)]
        return name if name and "/" not in name else None
