"""The job routes: a fill handed off, followed and cancelled by its id, on any replica.

``POST /v1/recipes/{name}/fill`` (:mod:`~genaug.service.api.recipes`) answers the job it
started; these routes read it back from the pool database (so every replica answers for every
job, and a restart forgets none) with its progress now, through the one object of the fill
jobs (:class:`~genaug.service.jobs.fill_jobs.FillJobs`, ``AppState.fill_jobs``):

- ``GET /v1/jobs/{id}``: state, asked and made per label, rate and ETA, times, webhook;
- ``GET /v1/jobs``: the recent ones, newest first (``recipe``, ``state``, ``limit``);
- ``POST /v1/jobs/{id}/cancel``: cancel a live job (409 naming its state once it ended);
- ``DELETE /v1/jobs/{id}``: forget a job (cancelled first if live): a 404 after.

Example::

    curl http://127.0.0.1:8000/v1/jobs/j_0123456789abcdef
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from genaug.job_states import JobState

from ..errors import NotFoundError
from ..jobs.view import JobList, JobView
from .requests import known_query, state_of
from .responses import error_responses
from .state import AppState

router = APIRouter()

JOB_ERRORS = error_responses(404, 422, 503)


def _no_recipe(recipe: str, app: AppState) -> NotFoundError:
    """A 404, as a fill of an unknown recipe is (the value fits the schema: any name)."""
    known = ", ".join(sorted(app.recipes)) or "none (set GENAUG_RECIPES)"
    return NotFoundError(f"recipe = {recipe[:80]!r}: no such recipe, and no job of one; "
                         f"this service has: {known}", field="recipe")


def _unknown(job_id: str) -> NotFoundError:
    return NotFoundError(f"id {job_id[:40]!r}: no such job; GET /v1/jobs lists the recent "
                         "ones", field="id")


@router.get("/v1/jobs", response_model=JobList, tags=["jobs"],
            responses=error_responses(404, 422, 503), dependencies=[Depends(known_query)])
async def list_jobs(
    request: Request,
    recipe: Annotated[str | None, Query(max_length=200, description="Only this recipe's.")]
    = None,
    state: Annotated[JobState | None, Query(description="Only jobs in this state.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="At most this many.")] = 50,
) -> JobList:
    """The most recent fill jobs, newest first, each with its progress. A ``recipe`` this
    service does not serve and no stored job names is a 404 naming the recipes it serves
    (a job of a recipe served before, or by another replica, is still listed)."""
    app = state_of(request)
    if not app.recipes:
        if recipe is not None:
            raise _no_recipe(recipe, app)
        return JobList(jobs=[])
    jobs = app.require_fill_jobs()

    def read() -> JobList:
        listed = jobs.recent(recipe, limit=limit, state=state)
        if recipe is not None and not listed and not jobs.known(recipe):
            raise _no_recipe(recipe, app)
        return JobList(jobs=listed)

    return await asyncio.to_thread(read)


@router.get("/v1/jobs/{job_id}", response_model=JobView, tags=["jobs"], responses=JOB_ERRORS)
async def get_job(job_id: str, request: Request) -> JobView:
    """One fill job: its state, what it asked and made per label, rate and ETA."""
    app = state_of(request)
    if not app.recipes:
        raise _unknown(job_id)
    found = await asyncio.to_thread(app.require_fill_jobs().view, job_id)
    if found is None:
        raise _unknown(job_id)
    return found


@router.post("/v1/jobs/{job_id}/cancel", response_model=JobView, tags=["jobs"],
             responses=error_responses(404, 409, 422, 503))
async def cancel_job(job_id: str, request: Request) -> JobView:
    """Cancel a live fill job: what it asked beyond what other live jobs still want is
    released (images made or in flight are kept); the job stays, ``cancelled``. 409 once it
    ended, naming its state."""
    app = state_of(request)
    if not app.recipes:
        raise _unknown(job_id)
    return await asyncio.to_thread(app.require_fill_jobs().cancel, job_id)


@router.delete("/v1/jobs/{job_id}", response_model=JobView, tags=["jobs"],
               responses=error_responses(404, 422, 503))
async def forget_job(job_id: str, request: Request) -> JobView:
    """Forget a fill job: a live one is cancelled first (as ``POST .../cancel`` does); its
    webhook is never sent. Answers the job as it was forgotten; ``GET`` is a 404 after, on
    every replica."""
    app = state_of(request)
    if not app.recipes:
        raise _unknown(job_id)
    return await asyncio.to_thread(app.require_fill_jobs().forget, job_id)
