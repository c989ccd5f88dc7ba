"""The recipe routes: list the recipes, one recipe's detail, sample from its pool, fill it,
and hear what a trainer needs (feedback).

``POST /v1/recipes/{name}/sample`` is the hot one: most calls are answered before this router
by :class:`~genaug.service.api.fastpath.DirectSample`, which calls :func:`sample` here
directly; the route stays registered and documents the operation.

Example::

    curl -X POST http://127.0.0.1:8000/v1/recipes/digits/sample -d '{"n": 64}' -o batch.st
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from genaug import __version__
from genaug.wire import PNG_MEDIA_TYPE, encode_batch, encode_png_grid

from ..intake.parse import read_body
from ..jobs.fill_jobs import FillJobs
from ..jobs.view import JobRef, job_url
from ..pool.serving import PoolServing, empty_images, unknown_recipe
from .negotiation import BATCH
from .requests import client_identity, state_of
from .responses import (
    RECIPE_ERRORS,
    SAFETENSORS_LAYOUT,
    FeedbackResponse,
    FillBudget,
    FillResponse,
    RecipeDetail,
    RecipeList,
    RecipeSummary,
    encoded,
    error_responses,
)
from .state import AppState

router = APIRouter()


@router.get("/v1/recipes", response_model=RecipeList, tags=["recipes"],
            responses=error_responses(503))
async def list_recipes(request: Request) -> RecipeList:
    """Recipes with their pools' fill per label (empty when no recipes are configured)."""
    state = state_of(request)
    if not state.recipes:
        return RecipeList(recipes=[])
    pools = state.require_pools()
    summaries = await asyncio.to_thread(
        lambda: [summary_of(pools, name) for name in state.recipes]
    )
    return RecipeList(recipes=summaries)


def summary_of(pools: PoolServing, name: str) -> RecipeSummary:
    """The recipe's summary with the labels its judge stopped (blocking: in a thread)."""
    return RecipeSummary(**pools.summary(name), stopped=pools.planner.stopped(name))


def detail_of(pools: PoolServing, fill_jobs: FillJobs, name: str, *,
              model: type[RecipeDetail] = RecipeDetail, **extra: Any) -> RecipeDetail:
    """The recipe's detail with its judge, the labels it stopped and its live jobs
    (blocking)."""
    planner = pools.planner
    judge = planner.judges.get(name)
    return model(**pools.detail(name), stopped=planner.stopped(name),
                 judge=judge.describe() if judge is not None else None,
                 jobs=fill_jobs.live(name), **extra)


def _hints(state: AppState, route: str, name: str) -> dict[str, str]:
    """The route's fix hints with this recipe's name in its URLs."""
    return {field: hint.replace("{name}", name)
            for field, hint in state.api.hints[route].items()}


def _pools_for(state: AppState, name: str) -> PoolServing:
    if name not in state.recipes:
        raise unknown_recipe(name, state.recipes)
    return state.require_pools()


@router.get(
    "/v1/recipes/{name}", response_model=RecipeDetail, tags=["recipes"],
    responses=RECIPE_ERRORS,
)
async def recipe_detail(name: str, request: Request) -> RecipeDetail:
    """Spec, pool identity, per-label fill, generated and served totals, generation rate."""
    state = state_of(request)
    pools = _pools_for(state, name)
    return await asyncio.to_thread(detail_of, pools, state.require_fill_jobs(), name)


@router.post(
    "/v1/recipes/{name}/sample",
    tags=["recipes"],
    response_class=Response,
    responses={
        **BATCH.responses(
            "k <= n images from the pool as a safetensors batch (k also in X-Genaug-Count; "
            "none is not an error). " + SAFETENSORS_LAYOUT + "Tensors: images uint8 "
            "[k, h, w, c] (c 3, or 1 for a recipe with output_channels 1), labels int32 [k] "
            "(indices into label_names), seeds int64 [k]. Metadata: recipe, "
            "label_names_json, pool_id, requested_json, returned_json, genaug_version, "
            "empty_labels_json (labels asked for that no image of the answer has: a pool "
            "still filling), stopped_json (labels asked for that the judge stopped, each "
            "with its reason and fix: no more images of them are made, and wait_s does not "
            "wait for them; also X-Genaug-Stopped-Labels) and, for variants of real images, "
            "source_hashes_json. With Accept: image/png, one PNG grid instead (each image's "
            "label in X-Genaug-Labels)."),
        204: {"description": "With Accept: image/png and no image to return: no body "
                             "(X-Genaug-Empty-Labels names the labels with none yet, "
                             "X-Genaug-Stopped-Labels those the judge stopped)."},
        **RECIPE_ERRORS,
    },
)
async def sample(name: str, request: Request) -> Response:
    """Up to ``n`` pre-generated images spread over ``labels``, at once (or after up to
    ``wait_s`` of generation). The count returned is explicit; none is not an error. Labels
    with no image in the answer (a pool still filling) are listed (metadata
    ``empty_labels``, header ``X-Genaug-Empty-Labels``). Labels the judge stopped (too few
    of their images accepted: none more are made) are not waited for; they are named with
    the judge's reason and fix (metadata ``stopped``, header ``X-Genaug-Stopped-Labels``), so
    a caller that waits can end and say why. ``Accept: image/png``: one PNG grid
    (``X-Genaug-Labels``: each image's label, in grid order; 204 when none)."""
    started = time.monotonic()
    answer = BATCH.choose(request)  # a 406 before the pool is read or anything generated
    state = state_of(request)
    client = client_identity(request)  # (a bad X-Client-Id: 422 before the pool is read)
    pools = _pools_for(state, name)
    body = await read_body(request, state.api.sample[name],
                           _hints(state, "sample", name))
    recipe = pools.recipe(name)
    labels = pools.resolve_labels(recipe, body.labels)
    result, recipe = await pools.sample(name, labels, body.n, body.wait_s)
    images = result.images if len(result) else empty_images(recipe)
    # Labels asked for that none of the images has (a pool still filling): said, not hidden.
    returned = set(result.labels)
    empty = [label for label in labels if label not in returned] if body.n > 0 else []
    headers = {"X-Genaug-Count": str(len(result)), "Vary": "Accept"}
    if state.batcher is not None:  # /v1/clients (served images are answered, even at stop)
        state.batcher.activity.sampled(client, name, images=len(result))
    if empty:
        headers["X-Genaug-Empty-Labels"] = ",".join(empty)
    # Labels no wait will ever fill, named with the judge's reason so that a waiter can end.
    stopped = pools.stopped(name, labels)
    if stopped:
        headers["X-Genaug-Stopped-Labels"] = ",".join(stopped)
    if answer.payload == PNG_MEDIA_TYPE:  # one grid, as /v1/generate answers a notebook
        state.metrics.request_latency.labels("sample").observe(time.monotonic() - started)
        if not len(result):
            return Response(status_code=204, headers=headers)
        payload = await asyncio.to_thread(encode_png_grid, images)
        headers["X-Genaug-Labels"] = ",".join(result.labels)
        return Response(payload, media_type=answer.media_type, headers=headers)
    metadata = {
        "recipe": name,
        "label_names": recipe.label_names,
        "pool_id": pools.pool_ids[name],
        "requested": body.n,
        "returned": len(result),
        "empty_labels": empty,
        "stopped": stopped,
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
    return Response(payload, media_type=answer.media_type, headers=headers)


@router.post(
    "/v1/recipes/{name}/fill", response_model=FillResponse, tags=["recipes"],
    responses={**RECIPE_ERRORS, **error_responses(409)},
)
async def fill(name: str, request: Request) -> RecipeDetail:
    """Fill every label of the recipe to at least ``per_label`` images, or generate
    ``images`` more split over the labels by the trainers' combined need and recent demand
    (``{"images": B}``: each label's ask rises from what it holds, is making or was asked
    for by its share of B, and asked-for images go before background pre-generation, so on a
    pre-generating service B images of the remaining work move forward; ``budget`` says
    how many were asked where, fewer than B when less room is left; 409 only when no label
    has room left below the pool capacity). One of the two. Generation runs in the
    background, when no request waits; answers at once with the current counts and the
    fill's job (``job``: ``GET /v1/jobs/{id}`` follows it, ``POST .../cancel`` cancels it). With
    ``notify_url`` the job's JSON is POSTed there, signed, once it ends (only to hosts in
    ``GENAUG_WEBHOOK_HOSTS``)."""
    state = state_of(request)
    pools = _pools_for(state, name)
    body = await read_body(request, state.api.fill[name],
                           _hints(state, "fill", name))
    notify_url = body.notify_url  # checked and normalised by the model, once
    fill_jobs = state.require_fill_jobs()
    budget = None
    if body.images is not None:
        answer, job = await asyncio.to_thread(fill_jobs.budget, name, body.images,
                                              notify_url=notify_url)
        budget = FillBudget(**answer)
    else:
        assert body.per_label is not None  # the model requires one of the two
        job = await asyncio.to_thread(fill_jobs.fill, name, body.per_label,
                                      notify_url=notify_url)
    state.wake_jobs()
    return await asyncio.to_thread(lambda: detail_of(
        pools, fill_jobs, name, model=FillResponse, budget=budget,
        job=JobRef(id=job.id, url=job_url(job.id))))


@router.post(
    "/v1/recipes/{name}/feedback", response_model=FeedbackResponse, tags=["recipes"],
    responses=RECIPE_ERRORS,
)
async def feedback(name: str, request: Request) -> FeedbackResponse:
    """Report this client's need per label (``{"need": {"<label>": number >= 0}}``): the
    planner fills labels in proportion to the need of all clients combined (each client's
    report normalised, decaying when not renewed). Answers the combination now in force."""
    state = state_of(request)
    pools = _pools_for(state, name)
    client = client_identity(request)
    body = await read_body(request, state.api.feedback[name],
                           _hints(state, "feedback", name))
    return FeedbackResponse(**pools.report_need(name, client, dict(body.need)))
