"""The service's job loop: move live jobs on and deliver the webhooks of those that ended.

Every :data:`JOB_POLL_S` seconds, and soon after images are stored, the loop asks
:class:`~genaug.service.jobs.fill_jobs.FillJobs` to move every live job of this replica's
pools (a job ends ``done`` or ``stopped`` on exactly one replica: the store's conditional
update), then to claim the pool's pending webhooks with a lease
(:meth:`~genaug.service.jobs.fill_jobs.FillJobs.deliveries`) and hands each to the
:class:`~genaug.service.jobs.webhooks.WebhookSender`. A delivery's end is recorded in the pool
(delivered or failed); a replica that stops mid-delivery leaves its claim to expire, and another
replica (or this one after a restart) delivers it. So each ended job's webhook is sent by one
replica at a time, and a restart loses none. Each attempt is counted in the pool as it starts
(``webhook.attempts`` in the job's JSON), and the first one's time is kept: no attempt starts
more than ``MAX_ELAPSED_S`` after it, whichever replica or start makes it.

The pool database work runs in a thread (``asyncio.to_thread``); webhooks are tasks on the
event loop with their own time bounds: a receiver that hangs or fails never holds the batcher,
which generates on its own threads.

Example::

    loop = JobLoop(fill_jobs, sender)  # sender None: webhooks off (GENAUG_WEBHOOK_HOSTS empty)
    loop.start()                      # on the event loop
    ...
    await loop.stop()
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..pool.types import PoolError
from .types import Job
from .view import JobView
from .webhooks import WebhookSender

if TYPE_CHECKING:
    from .fill_jobs import FillJobs

__all__ = ["JOB_POLL_S", "JobLoop"]

log = logging.getLogger(__name__)

#: How often live jobs are looked at when no image is stored meanwhile.
JOB_POLL_S = 1.0


class JobLoop:
    """Follows ``jobs``' fill jobs and delivers their webhooks through ``sender`` (None:
    webhooks off; jobs still end)."""

    def __init__(self, jobs: FillJobs, sender: WebhookSender | None,
                 *, poll_s: float = JOB_POLL_S) -> None:
        self.jobs = jobs
        self.sender = sender
        self.poll_s = poll_s
        self._task: asyncio.Task[None] | None = None
        self._poke = asyncio.Event()
        # Deliveries being recorded in the pool: held, since the loop keeps only weak refs.
        self._recording: set[asyncio.Task[object]] = set()

    def start(self) -> None:
        """Start the loop on the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="genaug-jobs")

    def poke(self) -> None:
        """Look at the jobs now (images were stored). Event loop thread only."""
        self._poke.set()

    async def stop(self) -> None:
        """Stop the loop, then cancel the deliveries in flight (their claims expire, and the
        next replica to look delivers them)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self.sender is not None:
            await self.sender.aclose()

    async def _run(self) -> None:
        while True:
            try:
                await self.once()
            except PoolError as exc:  # an outage: jobs wait with the pool
                log.debug("jobs: the pool database is unavailable (%s)", exc)
            except Exception:  # a bug here must not end the loop for good
                log.exception("jobs: the job loop failed; trying again")
            try:
                await asyncio.wait_for(self._poke.wait(), timeout=self.poll_s)
            except TimeoutError:
                pass
            self._poke.clear()

    async def once(self) -> list[Job]:
        """One round: move live jobs on, hand pending webhooks to the sender; the jobs this
        round ended."""
        ended = await asyncio.to_thread(self.jobs.advance)
        if self.sender is not None:
            # The claim is the store's lease, renewed by its heartbeat while this replica
            # lives and handed back when it stops: a restart delivers at once, and a replica
            # that died leaves it to the others after one lease (GENAUG_POOL_LEASE_S).
            for job, view in await asyncio.to_thread(self.jobs.deliveries):
                self._deliver(job, view)
        return ended

    def _deliver(self, job: Job, view: JobView) -> None:
        assert self.sender is not None and job.notify_url is not None
        jobs = self.jobs
        loop = asyncio.get_running_loop()

        def record(write: Callable[[], object]) -> None:
            # On the event loop: record it in a thread, the loop keeps serving.
            task = loop.create_task(asyncio.to_thread(write))
            self._recording.add(task)
            task.add_done_callback(self._recording.discard)

        def attempted(at: float) -> None:
            record(lambda: jobs.attempted(job.id, at))

        def done(delivered: bool) -> None:
            record(lambda: jobs.delivered(job.id, delivered))

        # The job's id is the delivery's: the same on a retry, after a restart, from any
        # replica, so a receiver drops what it already handled. Its window runs from the
        # first attempt any replica made (stored with the job), restarts included.
        self.sender.submit(job.notify_url, view.model_dump(mode="json"), on_result=done,
                           delivery=job.id, first_attempt_at=job.webhook_first,
                           on_attempt=attempted)
