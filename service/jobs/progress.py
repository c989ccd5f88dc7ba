"""How far a job is, and its next state: pure, given the counts read now and ``now``.

Nothing here reads the pool or the clock: the caller passes the job
(:class:`~genaug.service.jobs.types.Job`), the recipe's current
:class:`~genaug.service.pool.types.LabelStats` per label (one snapshot of
:meth:`~genaug.service.pool.store.PoolStore.stats`), the labels the judge stopped and ``now``
(seconds since the epoch, the clock of the job's ``created``).

Per label the job asked for: ``made`` since the job began, from the lifetime counters (never
lowered by eviction): ``generated`` delta, of which ``rejected`` (the judge's:
``judged_total - accepted_total`` delta) and ``accepted`` (the rest). ``met``:

- ``per_label``: the label holds what was asked (``fill >= asked``).
- ``images``: the label gained what was asked: ``accepted made >= asked`` beyond the images
  that were in flight when the job began (``start["reserved"]``: planned for earlier asks, they
  land after the start but are not the job's). Measured by what was made, not by the fill's
  growth, because at the capacity eviction keeps the fill flat
  while new images arrive: a job asking 10 more of a full label is met by 10 new accepted
  images (they replace the most-served ones), never by a fill that cannot grow. An image a
  person rejects later still counts as made (the judge kept it).

State: ``done`` when every label is met; else ``stopped`` when a label not met is stopped
(nothing more of it will be made); else ``running`` once anything was made for it, else
``queued``. An ended job keeps its state. ``rate``: accepted images per second since the job
was created; ``eta_s``: what is missing over that rate (None before the first image, 0 when
done); ``last_image``: when the newest image of its labels was added, if after the job began.

Example::

    progress = job_progress(job, store.stats(pid, list(job.asked)), stopped={}, now=time.time())
    progress.state, progress.labels["circle"].accepted, progress.eta_s
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from genaug.job_states import DONE, QUEUED, RUNNING, STOPPED

from ..pool.types import LabelStats
from .types import Job

__all__ = ["JobLabel", "JobProgress", "job_progress"]


class JobLabel(BaseModel):
    """One label of a job: what it asked, what was made since it began, and the fill now."""

    # One declaration: the progress computed here, stored as a job ends, and served.
    model_config = ConfigDict(frozen=True)

    asked: int = Field(description="per_label: the fill to hold; images: the images to gain.")
    made: int = Field(description="Images made since the job began (accepted + rejected).")
    accepted: int
    rejected: int = Field(description="Made and rejected by the recipe's judge.")
    fill: int = Field(description="The label's accepted images now.")
    missing: int = Field(description="What keeps the label from met.")
    met: bool
    stopped: bool = Field(description="The judge stopped the label: no more are made.")


@dataclass(frozen=True)
class JobProgress:
    """A job's progress at ``now``: ``state`` (the next one: compare with ``job.state``),
    ``reason`` (why stopped, naming the labels, with the judge's reason and fix), ``labels``
    (each label's counts), ``rate`` (accepted images per second since created) and ``eta_s``."""

    state: str
    reason: str | None
    labels: dict[str, JobLabel] = field(default_factory=dict)
    rate: float = 0.0
    eta_s: float | None = None
    #: When an image the job counts was last added (seconds since the epoch; None: none
    #: yet): a live job's ``updated`` moves with it, not only at a change of state.
    last_image: float | None = None
    #: For a ``speed: auto`` recipe, what auto decided or that it is still deciding (one
    #: line); None for any other recipe.
    sampling: str | None = None

    @property
    def made(self) -> int:
        return sum(p.made for p in self.labels.values())

    @property
    def accepted(self) -> int:
        return sum(p.accepted for p in self.labels.values())

    def as_dict(self) -> dict[str, Any]:
        """What :meth:`~genaug.service.jobs.queries.JobQueries.set_state` stores as the job's
        ``result`` when it ends (:meth:`from_dict` reads it back), under the job JSON's
        names."""
        return {"state": self.state, "reason": self.reason,
                "per_label": {label: p.model_dump() for label, p in self.labels.items()},
                "rate": self.rate, "eta_s": self.eta_s, "sampling": self.sampling}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobProgress:
        return cls(str(data["state"]), data.get("reason"),
                   {str(label): JobLabel(**p) for label, p in data["per_label"].items()},
                   float(data.get("rate", 0.0)), data.get("eta_s"),
                   sampling=data.get("sampling"))


def job_progress(job: Job, stats: Mapping[str, LabelStats], stopped: Mapping[str, str],
                 now: float, sampling: str | None = None) -> JobProgress:
    """``job``'s progress from ``stats`` (labels it asked that ``stats`` lacks count as
    empty) and ``stopped`` (label -> the judge's reason) at ``now``, with ``sampling`` (an
    ``auto`` recipe's decision, as a line): see the module doc. An ended job with a stored
    ``result`` answers that: what it had when it ended."""
    if not job.live and job.result is not None:
        ended = JobProgress.from_dict(job.result)
        return JobProgress(job.state, job.reason, ended.labels, ended.rate, ended.eta_s,
                           sampling=ended.sampling)
    labels: dict[str, JobLabel] = {}
    added = [stats[label].newest for label in job.asked if label in stats]
    newest = [t for t in added if t is not None and t >= job.created]
    for label, asked in job.asked.items():
        s = stats.get(label, LabelStats())
        start = job.start.get(label, {})
        # Clamped: a dropped pool resets its counters below the start.
        made = max(0, s.generated - start.get("generated", 0))
        rejected = max(0, (s.judged_total - s.accepted_total)
                       - (start.get("judged_total", 0) - start.get("accepted_total", 0)))
        accepted = max(0, made - rejected)
        # images: what was in flight when the job began lands after it, but was planned for
        # the asks before it; only images beyond those are the job's.
        have = s.fill if job.kind == "per_label" else max(0, accepted - start.get("reserved", 0))
        missing = max(0, asked - have)
        labels[label] = JobLabel(
            asked=asked, made=made, accepted=accepted, rejected=min(rejected, made),
            fill=s.fill, missing=missing, met=missing == 0, stopped=label in stopped)
    accepted_all = sum(p.accepted for p in labels.values())
    elapsed = now - job.created
    rate = accepted_all / elapsed if elapsed > 0 and accepted_all > 0 else 0.0
    missing_all = sum(p.missing for p in labels.values())
    eta = 0.0 if missing_all == 0 else (missing_all / rate if rate > 0 else None)
    blocked = sorted(label for label, p in labels.items() if not p.met and p.stopped)
    reason = None
    if not job.live:
        state, reason = job.state, job.reason
    elif missing_all == 0:
        state = DONE
    elif blocked:
        state = STOPPED
        reason = "; ".join(f"label {label!r} {stopped[label]}" for label in blocked)
    elif job.state == RUNNING or any(p.made > 0 for p in labels.values()):
        state = RUNNING
    else:
        state = QUEUED
    return JobProgress(state, reason, labels, rate, eta, max(newest, default=None), sampling)
