"""The routes that report: probes (``/healthz``, ``/readyz``), ``/v1/info``, ``/metrics``,
``/v1/clients``, ``/v1/status``, the recent images (``/v1/recent.png``) and the status page
(``/``). They read the app's state and change nothing.

Example::

    curl http://127.0.0.1:8000/v1/status
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

from genaug import __version__
from genaug.wire import encode_png_grid

from ..intake.fields import MIN_TIMEOUT_S
from .negotiation import IMAGE
from .recipes import summary_of
from .requests import state_of
from .responses import (
    READ_ERRORS,
    AccelerationInfo,
    AdapterInfo,
    ClientReport,
    ClientsResponse,
    DeviceInfo,
    HealthResponse,
    InfoResponse,
    Limits,
    ModelInfo,
    RecipeSummary,
    ReplicaInfo,
    StatusResponse,
    TurboInfo,
)
from .state import AppState

STATUS_PAGE = Path(__file__).parents[1] / "static" / "status.html"

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
    detail = state.load_error or state.starting()
    return JSONResponse(
        HealthResponse(status="not_ready", detail=detail).model_dump(), status_code=503
    )


def info_of(state: AppState) -> InfoResponse:
    """What ``GET /v1/info`` answers, grouped: model, device, adapters, acceleration, replica,
    limits."""
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
    # Every other limit is the setting of its name; these are what a request that leaves
    # them out gets (resolved once for the app), a constant, or a setting named otherwise.
    resolved: dict[str, Any] = {
        "min_timeout_s": MIN_TIMEOUT_S, "default_size": size, "default_steps": steps,
        "default_guidance": guidance, "default_timeout_s": s.request_timeout_s}
    acceleration = AccelerationInfo(**state.acceleration_info)
    return InfoResponse(
        version=__version__,
        ready=state.ready,
        auth=bool(s.api_keys),
        model=model,
        device=DeviceInfo(**device) if device else DeviceInfo(name=s.device, type="unknown"),
        adapters=[AdapterInfo(**a) for a in state.adapters_info],
        acceleration=acceleration,
        speed=acceleration,  # the deprecated alias, one release
        turbo=TurboInfo(**state.turbo_info) if state.turbo_info is not None else None,
        replica=ReplicaInfo(**state.replica_info),
        limits=Limits(**{name: resolved[name] if name in resolved else getattr(s, name)
                         for name in Limits.model_fields}),
    )


@router.get("/v1/info", response_model=InfoResponse, tags=["service"], responses=READ_ERRORS)
async def info(request: Request) -> InfoResponse:
    """Model, device, adapters, acceleration options, replica, limits and version."""
    return info_of(state_of(request))


@router.get("/metrics", response_class=PlainTextResponse, tags=["service"],
            responses=READ_ERRORS)
async def metrics(request: Request) -> Response:
    """Prometheus text format."""
    return Response(state_of(request).metrics.render(), media_type="text/plain; version=0.0.4")


def client_reports(state: AppState) -> list[ClientReport]:
    """Per client identity: its use of the generator, its queue and its rejections, and its
    pool samples (a trainer that only samples is listed too), with when it was last seen."""
    batcher = state.batcher
    if batcher is None:
        return []
    queued = batcher.queue.by_client()
    clients = batcher.activity.clients
    total = sum(c.generation_s for c in clients.values()) or 1.0
    recent = batcher.activity.recent_shares()
    now = time.time()
    reports = []
    for name in sorted(set(clients) | set(queued)):
        c = clients.get(name)
        seen = c.last_seen if c else None
        reports.append(ClientReport(
            client=name,
            requests=c.requests if c else 0,
            images=c.images if c else 0,
            generation_s=round(c.generation_s, 4) if c else 0.0,
            generation_share=round(c.generation_s / total, 4) if c else 0.0,
            share_last_minute=round(recent.get(name, 0.0), 4),
            queued_images=queued.get(name, 0),
            rejected=c.rejected if c else 0,
            dropped=c.dropped if c else 0,
            failed=c.failed if c else 0,
            samples=c.samples if c else 0,
            sampled_images=c.sampled_images if c else 0,
            sampled_recipes=sorted(c.sampled_recipes) if c else [],
            last_seen=round(seen, 3) if seen is not None else None,
            last_seen_ago_s=round(max(0.0, now - seen), 1) if seen is not None else None,
        ))
    return reports


@router.get("/v1/clients", response_model=ClientsResponse, tags=["service"],
            responses=READ_ERRORS)
async def clients(request: Request) -> ClientsResponse:
    """Per client identity: requests, images, share of generation time, queue, rejections,
    drops, and pool samples (requests, images served, recipes), with when it was last seen."""
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
            lambda: [summary_of(pools, name) for name in state.recipes]
        )
    return StatusResponse(
        info=info_of(state),
        queue_images=batcher.queued_images if batcher else 0,
        paused_batches=batcher.paused_batches if batcher else 0,
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
    response_class=Response,
    responses={**IMAGE.responses("The most recent images as one grid PNG."),
               204: {"description": "Nothing generated yet (no body)."}, **READ_ERRORS},
)
async def recent_png(request: Request) -> Response:
    """The most recently generated images (requests and pools) as one grid PNG."""
    answer = IMAGE.choose(request)
    batcher = state_of(request).batcher
    if batcher is None or not batcher.activity.recent:
        return Response(status_code=204)
    images = list(batcher.activity.recent)
    shape = images[-1].shape
    same = np.stack([im for im in images if im.shape == shape])
    payload = await asyncio.to_thread(encode_png_grid, same)
    return Response(payload, media_type=answer.media_type,
                    headers={"Cache-Control": "no-store", "Vary": "Accept"})


# What the page says before its first poll, replaced by what is true now (first_paint).
_POOLS_EMPTY = ('<div id="pools-body" class="muted">no recipes configured (GENAUG_RECIPES)'
                '</div>')
_RECENT_EMPTY = '<div id="recent-empty" class="muted">nothing generated yet</div>'


def first_paint(html: str, state: AppState) -> str:
    """The page as it should look before its first poll: the pools and the recent images
    said as they are now (from memory: no pool read), never "nothing generated yet" while
    images exist. The poll, at once, fills in the rest. The page is open (no key): with
    API keys set it says only that it is loading, no counts."""
    if state.settings.api_keys:
        loading = "loading (enter the API key if asked)…"
        return html.replace(_RECENT_EMPTY, _RECENT_EMPTY.replace("nothing generated yet",
                                                                 loading))
    if state.recipes:
        html = html.replace(_POOLS_EMPTY, _POOLS_EMPTY.replace(
            "no recipes configured (GENAUG_RECIPES)",
            f"loading the pools of {len(state.recipes)} recipe(s)…"))
    recent = len(state.batcher.activity.recent) if state.batcher is not None else 0
    stored = 0
    if state.pools is not None:
        stored = sum(s.fill for stats in state.pools.planner.last_stats.values()
                     for s in stats.values())
    if recent:
        said = f"loading the {recent} most recent images…"
    elif stored:
        said = (f"nothing generated since the service started; the pools hold {stored} "
                "images")
    else:
        said = "nothing generated yet"
    return html.replace(_RECENT_EMPTY, _RECENT_EMPTY.replace("nothing generated yet", said))


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def status_page(request: Request) -> HTMLResponse:
    """The self-contained status page (no CDN; refreshes itself, first at once), rendered
    with what is true now (:func:`first_paint`)."""
    html = STATUS_PAGE.read_text(encoding="utf-8")
    return HTMLResponse(first_paint(html, state_of(request)))
