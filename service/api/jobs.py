"""The job routes: a fill handed off, followed and cancelled by its id, on any replica.

``POST /v1/recipes/{name}/fill`` (:mod:`~genaug.service.api.recipes`) answers the job it
started; these routes read it back from the pool database (so every replica answers for every
job, and a restart forgets none) with its progress now:

- ``GET /v1/jobs/{id}``: state, asked and made per label, rate and ETA, times, webhook;
- ``GET /v1/jobs``: the recent ones, newest first (``recipe``, ``state``, ``limit``);
- ``DELETE /v1/jobs/{id}``: cancel a live job (409 naming its state once it ended).

Example::

    curl http://127.0.0.1:8000/v1/jobs/j_0123456789abcdef
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query, Request

from ..errors import NotFoundError
from ..jobs.view import job_view
from ..pool.types import JobState
from .requests import state_of
from .responses import JobList, JobView, error_responses

router = APIRouter()

JOB_ERRORS = error_responses(404, 422, 503)


def _unknown(job_id: str) -> NotFoundError:
    return NotFoundError(f"id {job_id[:40]!r}: no such job; GET /v1/jobs lists the recent "
                         "ones", field="id")


@router.get("/v1/jobs", response_model=JobList, tags=["jobs"],
            responses=error_responses(422, 503))
async def list_jobs(
    request: Request,
    recipe: Annotated[str | None, Query(max_length=200, description="Only this recipe's.")]
    = None,
    state: Annotated[JobState | None, Query(description="Only jobs in this state.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="At most this many.")] = 50,
) -> JobList:
    """The most recent fill jobs, newest first, each with its progress."""
    app = state_of(request)
    if not app.recipes:
        return JobList(jobs=[])
    runner = app.require_pools().planner.jobs

    def read() -> JobList:
        jobs = runner.planner.store.list_jobs(
            recipe, limit=limit, states=None if state is None else [state])
        return JobList(jobs=[JobView(**job_view(*runner.view(job))) for job in jobs])

    return await asyncio.to_thread(read)


@router.get("/v1/jobs/{job_id}", response_model=JobView, tags=["jobs"], responses=JOB_ERRORS)
async def get_job(job_id: str, request: Request) -> JobView:
    """One fill job: its state, what it asked and made per label, rate and ETA."""
    app = state_of(request)
    if not app.recipes:
        raise _unknown(job_id)
    runner = app.require_pools().planner.jobs
    found = await asyncio.to_thread(runner.status, job_id)
    if found is None:
        raise _unknown(job_id)
    return JobView(**job_view(*found))


@router.delete("/v1/jobs/{job_id}", response_model=JobView, tags=["jobs"],
               responses=error_responses(404, 409, 422, 503))
async def cancel_job(job_id: str, request: Request) -> JobView:
    """Cancel a live fill job: what it asked beyond what other live jobs still want is
    released (images made or in flight are kept). 409 once it ended, naming its state."""
    app = state_of(request)
    if not app.recipes:
        raise _unknown(job_id)
    runner = app.require_pools().planner.jobs
    return JobView(**job_view(*await asyncio.to_thread(runner.cancel, job_id)))
