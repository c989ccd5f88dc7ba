"""A fill job, as the service stores it: the leaf type of the jobs package.

Example::

    job = Job("j_0123456789abcdef", pid, "shapes", "per_label", "queued", {"circle": 20},
              start={"circle": {"fill": 3, "target": 20}}, created=t, updated=t)
    job.live, job.target("circle")        # (True, 20)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from genaug.job_states import LIVE

__all__ = ["JOB_KINDS", "Job"]

#: ``per_label``: every label holds ``asked``; ``images``: every label gains ``asked``.
JOB_KINDS = ("per_label", "images")


@dataclass(frozen=True)
class Job:
    """A fill handed off: stored with the pool, so it survives a restart and every replica
    answers for it (:mod:`~genaug.service.jobs.queries`).

    ``kind`` ``per_label`` asks each label of ``asked`` to hold that many accepted images;
    ``images`` asks each to gain that many since the job began. ``start`` holds, per label,
    the counts when the job began (``generated``, ``judged_total``, ``accepted_total``,
    ``fill``) and the shared ``target`` the job raised the label to. ``state`` is one of
    :data:`genaug.job_states.STATES`; ``reason`` says why it stopped, failed or was
    cancelled; times are seconds since the epoch (``ended`` None while live).
    ``webhook_state`` is None without ``notify_url``, else ``pending`` once the job ended,
    then ``delivered`` or ``failed``; ``webhook_attempts`` counts the POSTs made (every
    replica's, restarts included).
    """

    id: str
    pool_id: str
    recipe: str
    kind: str
    state: str
    asked: dict[str, int]
    start: dict[str, dict[str, int]]
    created: float
    updated: float
    notify_url: str | None = None
    reason: str | None = None
    ended: float | None = None
    webhook_state: str | None = None
    webhook_attempts: int = 0
    #: When the first delivery attempt started (seconds since the epoch), on any replica:
    #: no attempt starts more than ``MAX_ELAPSED_S`` after it, restarts included.
    webhook_first: float | None = None
    #: The progress as the job ended (:meth:`JobProgress.as_dict`); None while live.
    result: dict[str, Any] | None = None

    @property
    def live(self) -> bool:
        return self.state in LIVE

    def target(self, label: str) -> int:
        """The shared target this job raised ``label`` to (0 for a label it did not ask)."""
        return int(self.start.get(label, {}).get("target", 0))
