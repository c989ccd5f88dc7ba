"""Jobs moved on: read a job's progress, end it when its labels are met or stopped, cancel it.

The pool planner (:class:`~genaug.service.pool.planner.PoolPlanner`) creates a job with its
targets (``raise_target``, ``spend_job``); this module follows it. :meth:`JobRunner.status`
reads one job's progress (:mod:`~genaug.service.pool.job_progress`) from the pool's counts now
and moves a live job to the state its progress says (``running``, ``done``, ``stopped``); the
conditional update in the store makes exactly one replica win each move, and the winner of a
terminal one schedules the job's webhook. :meth:`JobRunner.advance` does so for every live
job of this replica's pools (the service's job loop calls it). A job ends with its progress
stored (``result``), so an ended job reports what it had when it ended.

A job of a pool this replica does not serve (another model, another recipe spec) is read but
never moved: the replicas that serve it do.

Example::

    runner = JobRunner(planner)
    job, progress = runner.status("j_0123456789abcdef")   # None for an unknown id
    runner.advance()                                    # the jobs this call ended
    runner.cancel("j_0123456789abcdef")                 # 409 once it ended
    runner.forget("j_0123456789abcdef")                 # gone: 404 after
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Protocol

from .job_progress import JobProgress, job_progress
from .store import PoolStore
from .types import Job

__all__ = ["JobRunner"]


class Planner(Protocol):
    """What the runner needs of :class:`~genaug.service.pool.planner.PoolPlanner` (which
    makes one: the planner is above this module)."""

    @property
    def store(self) -> PoolStore: ...

    @property
    def pool_ids(self) -> Mapping[str, str]: ...

    def stopped(self, name: str, *, cached: bool = False) -> dict[str, str]: ...

    def wake(self) -> None: ...


class JobRunner:
    """Follows the jobs of ``planner``'s pools. Every method blocks on the pool database:
    call it from a thread."""

    def __init__(self, planner: Planner) -> None:
        self.planner = planner

    def status(self, job_id: str) -> tuple[Job, JobProgress] | None:
        """The job (None: no such job) and its progress now; a live job whose progress says
        running, done or stopped is moved there first, by exactly one replica."""
        job = self.planner.store.get_job(job_id)
        return None if job is None else self._advance(job)

    def advance(self) -> list[Job]:
        """Move every live job of this replica's pools on; the jobs this call ended (their
        webhooks are now pending)."""
        ended = []
        for pid in dict.fromkeys(self.planner.pool_ids.values()):
            for job in self.planner.store.live_jobs(pid):
                after, _ = self._advance(job)
                if not after.live:
                    ended.append(after)
        return ended

    def cancel(self, job_id: str) -> tuple[Job, JobProgress]:
        """Cancel a live job, releasing what it asked beyond what live jobs still want; its
        progress as it was cancelled is kept. 404 for an unknown id, 409 (naming its state)
        for a job that already ended."""
        store = self.planner.store
        job = store.get_job(job_id)
        result = None
        if job is not None and job.live:
            result = self._progress(job, time.time()).as_dict()
        job = store.cancel_job(job_id, result=result)  # raises the 404 and the 409
        self.planner.wake()
        return job, self.progress_of(job)

    def forget(self, job_id: str) -> tuple[Job, JobProgress]:
        """Forget a job (cancelled first if live, as :meth:`cancel` does); the job and its
        progress as it was forgotten. 404 for an unknown id."""
        store = self.planner.store
        job = store.get_job(job_id)
        result = None
        if job is not None and job.live:
            result = self._progress(job, time.time()).as_dict()
        job = store.forget_job(job_id, result=result)  # raises the 404
        if result is not None:
            self.planner.wake()
        return job, self.progress_of(job)

    def view(self, job: Job) -> tuple[Job, JobProgress]:
        """``job`` (as read, e.g. listed) with its progress now; moves nothing."""
        return job, self._progress(job, time.time())

    def progress_of(self, job: Job) -> JobProgress:
        """An ended job's progress as it ended (stored with it): no pool read."""
        return job_progress(job, {}, {}, time.time())

    def _progress(self, job: Job, now: float) -> JobProgress:
        served = self.planner.pool_ids.get(job.recipe) == job.pool_id
        stopped = self.planner.stopped(job.recipe) if served else {}
        stats = self.planner.store.stats(job.pool_id, list(job.asked))
        return job_progress(job, stats, stopped, now)

    def _advance(self, job: Job) -> tuple[Job, JobProgress]:
        now = time.time()
        progress = self._progress(job, now)
        # A pool this replica does not serve (another model) is left to replicas that do.
        served = self.planner.pool_ids.get(job.recipe) == job.pool_id
        if served and job.live and progress.state != job.state:
            ending = progress.state not in ("queued", "running")
            self.planner.store.set_state(
                job.id, progress.state, progress.reason, from_states=(job.state,),
                result=progress.as_dict() if ending else None)
            job = self.planner.store.get_job(job.id) or job  # this move, or a racing one's
            progress = self._progress(job, now)
        return job, progress
