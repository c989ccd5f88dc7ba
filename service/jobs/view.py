"""A fill job as the API shows it and its webhook carries: one model, built in one place.

``GET /v1/jobs/{id}``, ``GET /v1/jobs``, ``POST /v1/jobs/{id}/cancel``, ``DELETE
/v1/jobs/{id}``, a recipe's live jobs and the webhook's body are all :func:`job_view` of a
:class:`~genaug.service.jobs.types.Job` and the
:class:`~genaug.service.jobs.progress.JobProgress` it reports (whose per-label counts,
:class:`~genaug.service.jobs.progress.JobLabel`, are served as they are), so a receiver reads
exactly what a poller reads. Times are ISO-8601 in UTC; ``rate`` is accepted images per second
since the job was created; ``eta_s`` what is missing over that rate (None before the first
image).

Example::

    job, progress = fill_jobs.status("j_0123456789abcdef")
    job_view(job, progress).state        # "running"
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, Field

from .progress import JobLabel, JobProgress
from .types import Job

__all__ = ["JobList", "JobRef", "JobView", "JobWebhook", "job_url", "job_view"]


class JobWebhook(BaseModel):
    state: str = Field(description="pending, delivered or failed.")
    attempts: int


class JobView(BaseModel):
    """A fill handed off (``GET /v1/jobs/{id}``; a webhook's body is the same object)."""

    id: str
    url: str
    recipe: str
    pool_id: str
    kind: str = Field(description="per_label or images.")
    state: str = Field(description="queued, running, done, stopped (the judge stopped a "
                       "label it needs), failed or cancelled.")
    reason: str | None = Field(description="Why it stopped, failed or was cancelled.")
    labels: dict[str, JobLabel]
    asked: int
    accepted: int
    missing: int
    rate: float = Field(description="Accepted images per second since it was created.")
    eta_s: float | None = Field(description="Seconds to done at that rate; null before the "
                                "first image.")
    created: str
    updated: str
    ended: str | None
    notify_url: str | None
    webhook: JobWebhook | None
    sampling: str | None = Field(
        default=None, description="A speed: auto recipe's sampler: what auto decided, or that "
        "it is still deciding and why (as the job ended, once it ended); null for any other "
        "recipe.")
    waiting: str | None = Field(
        default=None, description="Why a queued job has not started, when an api knows: no "
        "worker is running (it starts when one does); null otherwise.")


class JobList(BaseModel):
    jobs: list[JobView]


class JobRef(BaseModel):
    id: str
    url: str = Field(description="GET it for the job's progress; POST {url}/cancel to "
                                 "cancel it; DELETE it to forget it.")


def job_url(job_id: str) -> str:
    """The job's path on every replica."""
    return f"/v1/jobs/{job_id}"


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


def job_view(job: Job, progress: JobProgress, *, waiting: str | None = None) -> JobView:
    """The job's view (module doc); ``waiting``: why it has not started, shown while it is
    queued."""
    labels = progress.labels
    return JobView(
        id=job.id,
        url=job_url(job.id),
        recipe=job.recipe,
        pool_id=job.pool_id,
        kind=job.kind,
        state=progress.state,
        reason=progress.reason,
        labels=labels,
        asked=sum(p.asked for p in labels.values()),
        accepted=sum(p.accepted for p in labels.values()),
        missing=sum(p.missing for p in labels.values()),
        rate=round(progress.rate, 4),
        eta_s=None if progress.eta_s is None else round(progress.eta_s, 1),
        created=_iso(job.created) or "",
        # A state change, or the newest image the job counts: a live job's updated moves.
        updated=_iso(max(job.updated, progress.last_image or 0.0)) or "",
        ended=_iso(job.ended),
        notify_url=job.notify_url,
        webhook=(None if job.webhook_state is None
                 else JobWebhook(state=job.webhook_state, attempts=job.webhook_attempts)),
        sampling=progress.sampling,
        waiting=waiting if progress.state == "queued" else None,
    )
