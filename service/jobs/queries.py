"""Fill jobs in the pool database: stored beside the images, read and moved by every replica.

A **job** is a fill a client handed off: ``per_label`` (each label it asks holds that many
accepted images) or ``images`` (each label gains that many since the job began). It is a row of
``jobs`` (pool schema 4; the table is the store's: :mod:`genaug.service.pool.tables`), so it
survives a restart and every replica answers for it. :class:`JobQueries` composes over the
store's units of work (:mod:`genaug.service.pool.unit_of_work`): :meth:`JobQueries.create`
raises the labels' shared targets (:mod:`genaug.service.pool.shared_targets`) in the same
transaction it stores the job in, under the labels' locks, with the counts its progress starts
from read there too, so no image is counted on both sides of the start.

Transitions. :meth:`JobQueries.set_state` is a conditional UPDATE (``WHERE state IN
from_states``): across replicas exactly one caller wins a transition, and the winner of a
terminal one (done, stopped, failed, cancelled) is the one that schedules the webhook
(``webhook_state = 'pending'`` when the job has a ``notify_url``). Deliverers take pending
webhooks with a lease (:meth:`JobQueries.claim_webhook`), renewed by the store's heartbeat
and handed back when it closes (:meth:`JobQueries.renew_claims`, :meth:`JobQueries.hand_back`),
count each attempt as it starts (:meth:`JobQueries.webhook_attempted`) and report the end
(:meth:`JobQueries.finish_webhook`).

Cancelling (:meth:`JobQueries.cancel`) gives back what the job asked: each label's shared
target it held is lowered to the larger of what the other live jobs of the label still ask
and what the label holds and has in flight now; a target someone else raised beyond the
job's is left alone. Forgetting (:meth:`JobQueries.forget`) removes the row, cancelling it
first if it is live.

Lock order. The writers that change targets (``create``, ``cancel``, ``forget``) take the
labels' counter locks first, every label sorted, as every writer of the store does;
``set_state`` and the webhook queries change only their own rows and take no label lock.

Example::

    queries = JobQueries(store)
    job = queries.create(pid, "shapes", "per_label", {"circle": 20, "square": 20})
    queries.get(job.id).state                      # "queued"
    queries.set_state(job.id, "done", None, from_states=("queued", "running"))  # True once
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from genaug.job_states import CANCELLED, FAILED, LIVE, QUEUED, STATES

from ..errors import ConflictError, NotFoundError
from ..pool.shared_targets import counts_now, lower_target, raise_targets
from .types import JOB_KINDS, Job

if TYPE_CHECKING:
    from ..pool.unit_of_work import UnitOfWork, Units

__all__ = ["JobQueries", "new_job_id"]

log = logging.getLogger(__name__)

#: Why a dropped pool's live jobs failed.
DROPPED = "its pool was dropped (genaug pool drop)"

_COLUMNS = ("id, pool_id, recipe, kind, state, asked, start, notify_url, reason, created,"
            " updated, ended, webhook_state, webhook_attempts, result, webhook_first")
_LIVE = f"state IN ({', '.join(repr(state) for state in LIVE)})"
_SELECT = f"SELECT {_COLUMNS} FROM jobs"


def new_job_id() -> str:
    """``"j_"`` and 16 random hex characters: short, URL-safe, unguessable."""
    return "j_" + secrets.token_hex(8)


def _job(row: Sequence[Any]) -> Job:
    (job_id, pool_id, recipe, kind, state, asked, start, notify_url, reason, created, updated,
     ended, webhook_state, attempts, result, first) = row
    return Job(
        id=str(job_id), pool_id=str(pool_id), recipe=str(recipe), kind=str(kind),
        state=str(state), asked={str(k): int(v) for k, v in json.loads(asked).items()},
        start={str(k): {str(c): int(n) for c, n in v.items()}
               for k, v in json.loads(start).items()},
        created=float(created), updated=float(updated),
        notify_url=None if notify_url is None else str(notify_url),
        reason=None if reason is None else str(reason),
        ended=None if ended is None else float(ended),
        webhook_state=None if webhook_state is None else str(webhook_state),
        webhook_attempts=int(attempts or 0),
        result=None if result is None else json.loads(result),
        webhook_first=None if first is None else float(first),
    )


def _in(values: Sequence[str]) -> str:
    return ",".join("?" * len(values))


def _unknown(job_id: str) -> NotFoundError:
    return NotFoundError(f"id {job_id[:40]!r}: no such job; GET /v1/jobs lists the recent ones",
                         field="id")


class JobQueries:
    """The ``jobs`` table's queries over ``store``'s units of work (module doc)."""

    def __init__(self, store: Units) -> None:
        self.store = store

    # -- jobs ------------------------------------------------------------------------------

    def create(
        self, pool_id: str, recipe: str, kind: str, asked: Mapping[str, int], *,
        targets: Mapping[str, int] | None = None, notify_url: str | None = None,
    ) -> Job:
        """Store a new job and raise its labels' shared targets, in one transaction.

        ``asked``: per label, the fill it must hold (``per_label``) or the images it must gain
        (``images``). ``targets``: the shared target to raise each label to (never lowered;
        default ``asked`` for ``per_label``; required for ``images``, where the planner
        computes base + share). The job's ``start`` is read under the labels' locks: the
        counts progress is measured from, and the target it asked."""
        if kind not in JOB_KINDS:
            raise ValueError(f"kind {kind!r} is not one of {list(JOB_KINDS)}")
        if not asked or any(int(v) < 0 for v in asked.values()):
            raise ValueError(f"asked {dict(asked)!r}: give at least one label and counts >= 0")
        if targets is None:
            if kind != "per_label":
                raise ValueError("an 'images' job needs targets= (the absolute target per "
                                 "label: see PoolPlanner.plan_budget)")
            targets = asked
        labels = sorted(asked)
        now = time.time()
        job_id = new_job_id()
        with self.store.unit_of_work(write=True, locks={pool_id: labels}) as uow:
            start = counts_now(uow, pool_id, labels)
            for label in labels:
                start[label]["target"] = int(targets.get(label, 0))
            raise_targets(uow, pool_id, {label: targets.get(label, 0) for label in labels})
            uow.execute(
                f"INSERT INTO jobs ({_COLUMNS}) VALUES ({_in(_COLUMNS.split(','))})",
                (job_id, pool_id, recipe, kind, QUEUED,
                 json.dumps({k: int(asked[k]) for k in labels}), json.dumps(start),
                 notify_url, None, now, now, None, None, 0, None, None),
            )
        log.info("job %s: %s fill of %s asked %s", job_id, kind, pool_id, dict(asked))
        return Job(job_id, pool_id, recipe, kind, QUEUED, {k: int(asked[k]) for k in labels},
                   start, now, now, notify_url=notify_url)

    def get(self, job_id: str) -> Job | None:
        """The job with this id, or None."""
        with self.store.unit_of_work(write=False) as uow:
            return self._get(uow, job_id)

    def _get(self, uow: UnitOfWork, job_id: str) -> Job | None:
        row = uow.execute(f"{_SELECT} WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else _job(row)

    def recent(
        self, recipe: str | None = None, *, limit: int = 50,
        states: Sequence[str] | None = None,
    ) -> list[Job]:
        """The most recent jobs (of ``recipe``, in ``states``), newest first."""
        if not 1 <= limit <= 1000:
            raise ValueError(f"limit must be 1..1000, got {limit}")
        where, params = [], []
        if recipe is not None:
            where.append("recipe = ?")
            params.append(recipe)
        if states is not None:
            unknown = [s for s in states if s not in STATES]
            if unknown or not states:
                raise ValueError(f"states {list(states)!r}: use some of {list(STATES)}")
            where.append(f"state IN ({_in(states)})")
            params.extend(states)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        with self.store.unit_of_work(write=False) as uow:
            rows = uow.execute(f"{_SELECT}{clause} ORDER BY created DESC, id DESC LIMIT ?",
                               (*params, limit)).fetchall()
        return [_job(row) for row in rows]

    def live(self, pool_id: str) -> list[Job]:
        """The pool's queued and running jobs, oldest first."""
        with self.store.unit_of_work(write=False) as uow:
            rows = uow.execute(f"{_SELECT} WHERE pool_id = ? AND {_LIVE} ORDER BY created, id",
                               (pool_id,)).fetchall()
        return [_job(row) for row in rows]

    def set_state(
        self, job_id: str, state: str, reason: str | None = None, *,
        from_states: Sequence[str] = LIVE, result: Mapping[str, Any] | None = None,
    ) -> bool:
        """Move the job to ``state`` if it is in one of ``from_states``; True for the one
        caller (of every replica) whose UPDATE did it. A terminal ``state`` sets ``ended`` and,
        when the job has a ``notify_url``, schedules its webhook (``pending``). ``result``:
        the job's progress as it ended (stored as JSON, so an ended job reports what it had
        when it ended, not what the pool gained since)."""
        if state not in STATES or not from_states or any(s not in STATES for s in from_states):
            raise ValueError(f"state {state!r} / from_states {list(from_states)!r}: use "
                             f"{list(STATES)}")
        with self.store.unit_of_work(write=True) as uow:
            return self._set_state(uow, job_id, state, reason, from_states, result)

    def _set_state(self, uow: UnitOfWork, job_id: str, state: str, reason: str | None,
                   from_states: Sequence[str],
                   result: Mapping[str, Any] | None = None) -> bool:
        now = time.time()
        ended = state not in LIVE
        cur = uow.execute(
            "UPDATE jobs SET state = ?, reason = COALESCE(?, reason), updated = ?, ended = ?,"
            " result = COALESCE(?, result),"
            " webhook_state = CASE WHEN ? = 1 AND notify_url IS NOT NULL THEN 'pending'"
            " ELSE webhook_state END"
            f" WHERE id = ? AND state IN ({_in(from_states)})",
            (state, reason, now, now if ended else None,
             None if result is None else json.dumps(dict(result), sort_keys=True),
             int(ended), job_id, *from_states),
        )
        won = int(cur.rowcount) == 1
        if won and ended:
            log.info("job %s: %s%s", job_id, state, f" ({reason})" if reason else "")
        return won

    def cancel(self, job_id: str, reason: str = "cancelled by a client", *,
               result: Mapping[str, Any] | None = None) -> Job:
        """Cancel a live job and give back the targets it held (module doc); the job as it is
        now. :class:`~genaug.service.errors.NotFoundError` for an unknown id,
        :class:`~genaug.service.errors.ConflictError` (409) for a job that already ended."""
        with self.store.unit_of_work(write=True) as uow:
            job = self._get(uow, job_id)
            if job is None:
                raise _unknown(job_id)
            if not job.live or not self._end_live(uow, job, reason, result):
                state = uow.execute("SELECT state FROM jobs WHERE id = ?",
                                    (job_id,)).fetchone()[0]
                raise ConflictError(
                    f"id {job_id!r}: the job already ended ({state}); there is nothing to "
                    f"cancel. GET /v1/jobs/{job_id} says how it ended, DELETE forgets it; "
                    "start a new fill to ask for more", field="id")
            return self._get(uow, job_id) or job

    def forget(self, job_id: str, reason: str = "cancelled, then forgotten, by a client", *,
               result: Mapping[str, Any] | None = None) -> Job:
        """Remove the job; a live one is cancelled first (its targets given back, as
        :meth:`cancel` does), in the same transaction. Its webhook, pending or not, is never
        sent. The job as it was when forgotten (cancelled, if it was live);
        :class:`~genaug.service.errors.NotFoundError` for an unknown id."""
        with self.store.unit_of_work(write=True) as uow:
            job = self._get(uow, job_id)
            if job is None:
                raise _unknown(job_id)
            if job.live and self._end_live(uow, job, reason, result):
                job = self._get(uow, job_id) or job
            uow.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
        log.info("job %s: forgotten (%s)", job_id, job.state)
        return job

    def _end_live(self, uow: UnitOfWork, job: Job, reason: str,
                  result: Mapping[str, Any] | None) -> bool:
        """Cancel ``job`` (live when read) under its labels' locks and give back its targets;
        False when another replica ended it first."""
        for label in sorted(job.asked):  # the store's lock order, as a writer of targets
            uow.lock(job.pool_id, label)
        if not self._set_state(uow, job.id, CANCELLED, reason, LIVE, result):
            return False
        others = [_job(r) for r in uow.execute(
            f"{_SELECT} WHERE pool_id = ? AND {_LIVE} AND id <> ?",
            (job.pool_id, job.id)).fetchall()]
        for label in sorted(job.asked):
            moved = lower_target(uow, job.pool_id, label, held=job.target(label),
                                 others=[o.target(label) for o in others])
            if moved is not None:
                log.info("job %s cancelled: label %s target %d -> %d", job.id, label, *moved)
        return True

    def fail_live(self, uow: UnitOfWork, pool_id: str, reason: str = DROPPED) -> int:
        """End every live job of the pool as failed (its pool is gone), in ``uow``:
        ``genaug pool drop`` passes this to
        :meth:`~genaug.service.pool.store.PoolStore.drop_pool`."""
        ids = [str(r[0]) for r in uow.execute(
            f"SELECT id FROM jobs WHERE pool_id = ? AND {_LIVE}", (pool_id,)).fetchall()]
        return sum(self._set_state(uow, i, FAILED, reason, LIVE) for i in ids)

    # -- webhooks --------------------------------------------------------------------------

    def claim_webhook(self, owner: str, lease_s: float, *, limit: int = 20) -> list[Job]:
        """Take up to ``limit`` jobs whose webhook is pending and not claimed by a live lease:
        each is ``owner``'s for ``lease_s`` seconds, a lease the store's heartbeat renews
        while ``owner`` lives (:meth:`renew_claims`) and that closing the store hands back
        (:meth:`hand_back`). Another replica gets it only after the lease, so one delivers at
        a time; a replica that died leaves it after one lease."""
        if lease_s <= 0 or limit < 1:
            raise ValueError(f"lease_s must be > 0 and limit >= 1, got {lease_s}, {limit}")
        with self.store.unit_of_work(write=True) as uow:
            free = ("webhook_state = 'pending' AND (webhook_until IS NULL"
                    f" OR webhook_until <= {uow.now})")
            # The condition again outside the subquery: PostgreSQL re-checks it on a row
            # another replica claimed meanwhile, so a row is never claimed twice.
            rows = uow.execute(
                f"UPDATE jobs SET webhook_claim = ?, webhook_until = {uow.now} + ?"
                f" WHERE id IN (SELECT id FROM jobs WHERE {free} ORDER BY ended LIMIT ?)"
                f" AND {free} RETURNING {_COLUMNS}",
                (owner, float(lease_s), limit),
            ).fetchall()
        return sorted((_job(r) for r in rows), key=lambda j: (j.ended or 0.0, j.id))

    def renew_claims(self, uow: UnitOfWork, owner: str, lease_s: float) -> None:
        """Extend ``owner``'s claims on pending webhooks by ``lease_s`` (the store's
        heartbeat runs it: ``store.on_renew``)."""
        uow.execute(f"UPDATE jobs SET webhook_until = {uow.now} + ?"
                    " WHERE webhook_claim = ? AND webhook_state = 'pending'",
                    (float(lease_s), owner))

    def hand_back(self, uow: UnitOfWork, owner: str) -> None:
        """Give back ``owner``'s claims on deliveries not finished (the store's close runs it:
        ``store.on_close``): the next start, or another replica, takes them up at once,
        within what is left of their window."""
        uow.execute("UPDATE jobs SET webhook_claim = NULL, webhook_until = NULL"
                    " WHERE webhook_claim = ? AND webhook_state = 'pending'", (owner,))

    def webhook_attempted(self, job_id: str, at: float) -> None:
        """Count one delivery attempt of ``job_id``'s webhook, started at ``at`` (seconds
        since the epoch; the first one's time is kept: the delivery's window runs from it)."""
        with self.store.unit_of_work(write=True) as uow:
            uow.execute("UPDATE jobs SET webhook_attempts = webhook_attempts + 1,"
                        " webhook_first = COALESCE(webhook_first, ?) WHERE id = ?",
                        (float(at), job_id))

    def finish_webhook(
        self, job_id: str, delivered: bool, *, owner: str | None = None,
        retry_after_s: float | None = None,
    ) -> bool:
        """Record a delivery: ``delivered``, or failed for good, or (``retry_after_s``) pending
        again after that many seconds. With ``owner`` only while it holds the claim. True
        when recorded."""
        params: list[Any]
        with self.store.unit_of_work(write=True) as uow:
            if delivered or retry_after_s is None:
                sets = "webhook_state = ?, webhook_claim = NULL, webhook_until = NULL"
                params = ["delivered" if delivered else "failed"]
            else:
                sets = f"webhook_claim = NULL, webhook_until = {uow.now} + ?"
                params = [float(retry_after_s)]
            where = "id = ? AND webhook_state = 'pending'"
            params.append(job_id)
            if owner is not None:
                where += " AND webhook_claim = ?"
                params.append(owner)
            return int(uow.execute(f"UPDATE jobs SET {sets} WHERE {where}",
                                   params).rowcount) == 1
