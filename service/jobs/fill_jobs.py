"""The fill-job feature behind one object: :class:`FillJobs`, which the routes and the job loop
call.

A fill a client hands off (``POST /v1/recipes/{name}/fill``) becomes a job: started here with
the shared targets the planner works out for it (:meth:`FillJobs.fill`, :meth:`FillJobs.budget`),
stored in the pool database with them in one transaction (:mod:`~genaug.service.jobs.queries`),
followed by its id on any replica (:meth:`FillJobs.status`, :meth:`FillJobs.recent`), cancelled
or forgotten, and moved on by the loop's round (:meth:`FillJobs.advance`: a live job whose
progress says running, done or stopped is moved there by exactly one replica, and the winner
of a terminal move schedules its webhook). Its progress (:mod:`~genaug.service.jobs.progress`)
is read from the pool's counts now; an ended job keeps the progress it ended with. The
webhooks' claims ride on the store's heartbeat and close (registered here), so a delivery cut
off by a stop resumes on the next start.

A job of a pool this replica does not serve (another model, another recipe spec) is read but
never moved: the replicas that serve it do. Every method blocks on the pool database: call it
from a thread.

Example::

    jobs = FillJobs(planner)
    job = jobs.fill("shapes", 500, notify_url=None)        # a per_label job
    job, progress = jobs.status(job.id)                     # None for an unknown id
    jobs.advance()                                          # the jobs this round ended
    jobs.cancel(job.id)                                     # 409 once it ended
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from genaug.job_states import LIVE

from ..pool.serving import unavailable, unknown_recipe
from .progress import JobProgress, job_progress
from .queries import JobQueries
from .types import Job
from .view import JobView, job_view

if TYPE_CHECKING:
    from ..pool.planner import PoolPlanner

__all__ = ["FillJobs"]

class FillJobs:
    """The fill jobs of ``planner``'s pools (module doc)."""

    def __init__(self, planner: PoolPlanner) -> None:
        self.planner = planner
        self.store = planner.store
        self.queries = JobQueries(self.store)
        store = self.store
        # A delivery this replica claimed is its own while it lives (the heartbeat renews the
        # claim) and is handed back when it stops (the next start takes it up at once).
        store.on_renew.append(lambda uow: self.queries.renew_claims(uow, store.owner,
                                                                     store.lease_s))
        store.on_close.append(lambda uow: self.queries.hand_back(uow, store.owner))
        #: Why a queued job waits, when this process knows (the api role: no worker runs).
        self.waiting: Callable[[], str | None] = lambda: None

    # -- starting -----------------------------------------------------------------------

    def fill(self, name: str, per_label: int, *, notify_url: str | None = None) -> Job:
        """A ``per_label`` job: every label of ``name`` to hold ``per_label`` accepted images
        (each at most its limit), its shared targets raised with it."""
        self._known(name)
        asked, targets = self.planner.plan_fill(name, per_label)
        with unavailable():
            job = self.queries.create(self.planner.pool_ids[name], name, "per_label", asked,
                                      targets=targets, notify_url=notify_url)
        self.planner.wake()
        return job

    def budget(self, name: str, images: int, *,
               notify_url: str | None = None) -> tuple[dict[str, Any], Job]:
        """An ``images`` job: ``images`` more, split over the labels by need and demand
        (:meth:`~genaug.service.pool.planner.PoolPlanner.plan_budget`); what happens
        (``requested``, ``asked``, ``per_label`` and a sentence) and the job."""
        self._known(name)
        with unavailable():
            shares, targets, alloc = self.planner.plan_budget(name, images)
            job = self.queries.create(self.planner.pool_ids[name], name, "images", shares,
                                      targets=targets, notify_url=notify_url)
        self.planner.wake()
        asked = sum(alloc.values())
        note = (f"{asked} images asked for, split by need and demand; they are generated "
                "before background pre-generation")
        if asked < images:
            note += (f" ({images - asked} fewer than requested: that is all the room left "
                     f"below the capacity of {self.store.capacity_per_label} per label)")
        return {"requested": images, "asked": asked, "per_label": alloc, "note": note}, job

    def _known(self, name: str) -> None:
        if name not in self.planner.recipes:
            raise unknown_recipe(name, self.planner.recipes)

    # -- reading ------------------------------------------------------------------------

    def status(self, job_id: str) -> tuple[Job, JobProgress] | None:
        """The job (None: no such job) and its progress now; a live job whose progress says
        running, done or stopped is moved there first, by exactly one replica."""
        job = self.queries.get(job_id)
        return None if job is None else self._advance(job)

    def view(self, job_id: str) -> JobView | None:
        """:meth:`status` as the API shows it."""
        found = self.status(job_id)
        return None if found is None else job_view(*found, waiting=self.waiting())

    def recent(self, recipe: str | None = None, *, limit: int = 50,
             state: str | None = None) -> list[JobView]:
        """The most recent jobs (of ``recipe``, in ``state``), newest first, with their
        progress now; moves nothing."""
        jobs = self.queries.recent(recipe, limit=limit, states=None if state is None else [state])
        waiting = self.waiting()
        return [job_view(job, self._progress(job, time.time()), waiting=waiting)
                for job in jobs]

    def known(self, recipe: str) -> bool:
        """Whether ``recipe`` is served here or named by a stored job (a replica's, an old
        spec's): a filter by it is not a typo."""
        return recipe in self.planner.recipes or bool(self.queries.recent(recipe, limit=1))

    def live(self, recipe: str) -> list[JobView]:
        """``recipe``'s queued and running jobs, oldest first, with their progress now."""
        now, waiting = time.time(), self.waiting()
        return [job_view(job, self._progress(job, now), waiting=waiting)
                for job in self.queries.live(self.planner.pool_ids[recipe])]

    # -- ending -------------------------------------------------------------------------

    def cancel(self, job_id: str) -> JobView:
        """Cancel a live job, giving back what it asked beyond what live jobs still want; its
        progress as it was cancelled is kept. 404 for an unknown id, 409 (naming its state)
        for a job that already ended."""
        job = self.queries.cancel(job_id, result=self._live_result(job_id))
        self.planner.wake()
        return job_view(job, self._ended(job))

    def forget(self, job_id: str) -> JobView:
        """Forget a job (cancelled first if live, as :meth:`cancel` does); the job as it was
        forgotten. 404 for an unknown id."""
        result = self._live_result(job_id)
        job = self.queries.forget(job_id, result=result)
        if result is not None:
            self.planner.wake()
        return job_view(job, self._ended(job))

    def _live_result(self, job_id: str) -> dict[str, Any] | None:
        job = self.queries.get(job_id)
        return None if job is None or not job.live else self._progress(
            job, time.time()).as_dict()

    # -- the loop's round ---------------------------------------------------------------

    def advance(self) -> list[Job]:
        """Move every live job of this replica's pools on; the jobs this call ended (their
        webhooks are now pending)."""
        ended = []
        for pid in dict.fromkeys(self.planner.pool_ids.values()):
            for job in self.queries.live(pid):
                after, _ = self._advance(job)
                if not after.live:
                    ended.append(after)
        return ended

    def deliveries(self) -> list[tuple[Job, JobView]]:
        """The ended jobs whose webhook this replica claims now (for one lease of the pool),
        each with the body to send."""
        claimed = self.queries.claim_webhook(self.store.owner, self.store.lease_s)
        return [(job, job_view(job, self._ended(job))) for job in claimed]

    def attempted(self, job_id: str, at: float) -> None:
        """A delivery attempt of ``job_id``'s webhook started at ``at``."""
        self.queries.webhook_attempted(job_id, at)

    def delivered(self, job_id: str, ok: bool) -> None:
        """``job_id``'s delivery ended: delivered or failed for good."""
        self.queries.finish_webhook(job_id, ok, owner=self.store.owner)

    # -- progress -----------------------------------------------------------------------

    def _ended(self, job: Job) -> JobProgress:
        """An ended job's progress as it ended (stored with it): no pool read."""
        return job_progress(job, {}, {}, time.time())

    def _served(self, job: Job) -> bool:
        return self.planner.pool_ids.get(job.recipe) == job.pool_id

    def _progress(self, job: Job, now: float) -> JobProgress:
        served = self._served(job)
        stopped = self.planner.stopped(job.recipe) if served else {}
        stats = self.store.stats(job.pool_id, list(job.asked))
        sampling = self._sampling(job.recipe) if served and job.live else None
        return job_progress(job, stats, stopped, now, sampling)

    def _sampling(self, name: str) -> str | None:
        """An ``auto`` recipe's decision as one line: what it chose, or that it is still
        deciding and why; None for any other recipe."""
        told = self.planner.samplers.describe(name)
        if told.get("speed") != "auto":
            return None
        if told["state"] == "decided" and told.get("sampler"):
            cheaper = told.get("cheaper") or 1.0
            if cheaper <= 1.0:
                return f"auto decided: {told['sampler']['name']}, the recipe's own sampler"
            return (f"auto decided: {told['sampler']['name']} ({cheaper:g}x fewer UNet rows "
                    "per image than the recipe's own sampler)")
        return f"auto is still deciding: {told['reason']}"

    def _advance(self, job: Job) -> tuple[Job, JobProgress]:
        now = time.time()
        progress = self._progress(job, now)
        # A pool this replica does not serve (another model) is left to replicas that do.
        if self._served(job) and job.live and progress.state != job.state:
            ending = progress.state not in LIVE
            self.queries.set_state(
                job.id, progress.state, progress.reason, from_states=(job.state,),
                result=progress.as_dict() if ending else None)
            job = self.queries.get(job.id) or job  # this move, or a racing one's
            progress = self._progress(job, now)
        return job, progress
