"""A job as the API shows it and its webhook carries: one dict, built in one place.

``GET /v1/jobs/{id}``, ``GET /v1/jobs``, ``POST /v1/jobs/{id}/cancel``, ``DELETE
/v1/jobs/{id}``, a recipe's live jobs and
the webhook's body are all :func:`job_view` of a :class:`~genaug.service.pool.types.Job` and
its :class:`~genaug.service.pool.job_progress.JobProgress`, so a receiver reads exactly what a
poller reads. Times are ISO-8601 in UTC; ``rate`` is accepted images per second since the job
was created; ``eta_s`` what is missing over that rate (None before the first image).

Example::

    job, progress = planner.jobs.status("j_0123456789abcdef")
    job_view(job, progress)["state"]      # "running"
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ..pool.job_progress import JobProgress
from ..pool.types import Job

__all__ = ["job_url", "job_view"]


def job_url(job_id: str) -> str:
    """The job's path on every replica."""
    return f"/v1/jobs/{job_id}"


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


def job_view(job: Job, progress: JobProgress) -> dict[str, Any]:
    """The job's JSON (module doc)."""
    labels = {label: p.as_dict() for label, p in progress.per_label.items()}
    return {
        "id": job.id,
        "url": job_url(job.id),
        "recipe": job.recipe,
        "pool_id": job.pool_id,
        "kind": job.kind,
        "state": progress.state,
        "reason": progress.reason,
        "labels": labels,
        "asked": sum(p["asked"] for p in labels.values()),
        "accepted": sum(p["accepted"] for p in labels.values()),
        "missing": sum(p["missing"] for p in labels.values()),
        "rate": round(progress.rate, 4),
        "eta_s": None if progress.eta_s is None else round(progress.eta_s, 1),
        "created": _iso(job.created),
        # A state change, or the newest image the job counts: a live job's updated moves.
        "updated": _iso(max(job.updated, progress.last_image or 0.0)),
        "ended": _iso(job.ended),
        "notify_url": job.notify_url,
        "webhook": (None if job.webhook_state is None
                    else {"state": job.webhook_state, "attempts": job.webhook_attempts}),
    }
