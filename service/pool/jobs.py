"""Jobs in the pool database: a fill handed off, followed by every replica, and its end told.

A **job** is a fill a client handed off: ``per_label`` (each label it asks holds that many
accepted images) or ``images`` (each label gains that many since the job began). It is a row
of ``jobs`` beside the images (schema 4, SQLite and PostgreSQL), so it survives a restart and
every replica answers for it. Targets stay shared per label (``targets``, what the planner
fills to): :meth:`JobQueries.create_job` raises them in the same transaction it stores the job
in, with the counts the job's progress starts from read under the same label locks, so no
image is counted on both sides of the start. Two jobs may be satisfied by the same images.
How far a job is, and its next state, is pure: :mod:`~genaug.service.pool.job_progress`.

Transitions. :meth:`JobQueries.set_state` is a conditional UPDATE (``WHERE state IN
from_states``): across replicas exactly one caller wins a transition, and the winner of a
terminal one (done, stopped, failed, cancelled) is the one that schedules the webhook
(``webhook_state = 'pending'`` when the job has a ``notify_url``). Deliverers take pending
webhooks with a lease (:meth:`JobQueries.claim_webhook`) and report back
(:meth:`JobQueries.finish_webhook`); a deliverer that dies leaves its claim to expire.

Cancelling (:meth:`JobQueries.cancel_job`) releases what the job asked: each label's shared
target the job held is lowered to the larger of what the other live jobs of the label still
ask and what the label holds and has in flight now (so nothing made or being made is
wasted); a target someone else raised beyond the job's is left alone. Forgetting
(:meth:`JobQueries.forget_job`) removes the job's row, cancelling it first if it is live.

**Stops.** The judge's stops live in the same schema (``stops``), queried by
:mod:`~genaug.service.pool.stop_queries`; a job whose label stopped ends ``stopped``.

Lock order. The writers that change targets (``create_job``, ``cancel_job``) take the labels'
counter locks first, in sorted order, as every writer of the store does; ``set_state``
and the webhook queries change only their own rows and take no label lock.

Example::

    job = store.create_job(pid, "shapes", "per_label", {"circle": 20, "square": 20})
    store.get_job(job.id).state                      # "queued"
    store.set_state(job.id, "done", None, from_states=("queued", "running"))  # True once
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from ..errors import ConflictError, NotFoundError
from .types import JOB_KINDS, JOB_STATES, LIVE_JOB_STATES, Job

__all__ = ["JobQueries", "job_tables", "new_job_id"]

log = logging.getLogger("genaug.service.pool.store")  # the store's messages, one logger

# Schema 4's tables, one text for both backends (the dialects differ only where filled in):
# ``{real}`` is the backend's float type, ``{options}`` what follows a table's definition.
# No semicolons but between statements: the text is split on them.
_TABLES = """
CREATE TABLE IF NOT EXISTS jobs (
    id               TEXT PRIMARY KEY,
    pool_id          TEXT    NOT NULL,
    recipe           TEXT    NOT NULL,
    kind             TEXT    NOT NULL,
    state            TEXT    NOT NULL,
    asked            TEXT    NOT NULL,
    start            TEXT    NOT NULL,
    notify_url       TEXT,
    reason           TEXT,
    created          {real}  NOT NULL,
    updated          {real}  NOT NULL,
    ended            {real},
    webhook_state    TEXT,
    webhook_claim    TEXT,
    webhook_until    {real},
    webhook_attempts INTEGER NOT NULL DEFAULT 0,
    result           TEXT,
    webhook_first    {real}
){options};
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state);
CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created);
CREATE TABLE IF NOT EXISTS stops (
    pool_id    TEXT   NOT NULL,
    label      TEXT   NOT NULL,
    reason     TEXT   NOT NULL,
    judge_key  TEXT   NOT NULL,
    stopped_at {real} NOT NULL,
    PRIMARY KEY (pool_id, label)
){options};
"""

_COLUMNS = ("id, pool_id, recipe, kind, state, asked, start, notify_url, reason, created,"
            " updated, ended, webhook_state, webhook_attempts, result, webhook_first")
_LIVE = "state IN ('queued', 'running')"


def new_job_id() -> str:
    """``"j_"`` and 16 random hex characters: short, URL-safe, unguessable."""
    return "j_" + secrets.token_hex(8)


def job_tables(*, real: str, options: str = "") -> list[str]:
    """Schema 4's ``jobs`` and ``stops`` tables and their indexes, one statement each, in one
    backend's dialect: ``real`` is its float type, ``options`` follows each table's definition.

    Example::

        job_tables(real="DOUBLE PRECISION")                # PostgreSQL
        job_tables(real="REAL", options=" WITHOUT ROWID")  # SQLite: the keys are text
    """
    script = _TABLES.format(real=real, options=options)
    return [statement.strip() for statement in script.split(";") if statement.strip()]


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


class JobQueries:
    """``create_job``, ``get_job``, ``list_jobs``, ``live_jobs``, ``set_state``,
    ``cancel_job`` and the webhook claims; mixed into
    :class:`~genaug.service.pool.store.PoolStore` (the module doc explains each)."""

    if TYPE_CHECKING:  # hooks: PoolStore defines them
        _NOW: str
        _GREATEST: str

        def _tx(self, *, write: bool) -> AbstractContextManager[Any]: ...
        def _exec(self, conn: Any, sql: str, params: Sequence[Any] = ()) -> Any: ...
        def _lock_label(self, conn: Any, pool_id: str, label: str) -> int: ...

    # -- jobs ------------------------------------------------------------------------------

    def create_job(
        self,
        pool_id: str,
        recipe: str,
        kind: str,
        asked: Mapping[str, int],
        *,
        targets: Mapping[str, int] | None = None,
        notify_url: str | None = None,
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
                                 "label: see PoolPlanner.spend)")
            targets = asked
        labels = sorted(asked)
        now = time.time()
        job_id = new_job_id()
        with self._tx(write=True) as conn:
            for label in labels:  # the store's lock order: every label, sorted, first
                self._lock_label(conn, pool_id, label)
            start = self._counts(conn, pool_id, labels)
            for label in labels:
                target = int(targets.get(label, 0))
                start[label]["target"] = target
                if target > 0:
                    self._exec(
                        conn,
                        "INSERT INTO targets (pool_id, label, target) VALUES (?, ?, ?)"
                        " ON CONFLICT (pool_id, label) DO UPDATE SET"
                        f" target = {self._GREATEST}(targets.target, excluded.target)",
                        (pool_id, label, target),
                    )
            self._exec(
                conn,
                f"INSERT INTO jobs ({_COLUMNS}) VALUES ({_in(_COLUMNS.split(','))})",
                (job_id, pool_id, recipe, kind, "queued",
                 json.dumps({k: int(asked[k]) for k in labels}), json.dumps(start),
                 notify_url, None, now, now, None, None, 0, None, None),
            )
        log.info("job %s: %s fill of %s asked %s", job_id, kind, pool_id, dict(asked))
        return Job(job_id, pool_id, recipe, kind, "queued", {k: int(asked[k]) for k in labels},
                   start, now, now, notify_url=notify_url)

    def _counts(self, conn: Any, pool_id: str, labels: Sequence[str]) -> dict[str, dict[str, int]]:
        """Per label: generated, judged_total, accepted_total (lifetime), fill and the images
        in flight (``reserved``: live reservations of every replica) now."""
        out = {label: {"generated": 0, "judged_total": 0, "accepted_total": 0, "fill": 0,
                       "reserved": 0} for label in labels}
        for label, generated, judged, kept in self._exec(
            conn,
            "SELECT label, generated_total, judged_total, accepted_total FROM counters"
            " WHERE pool_id = ?",
            (pool_id,),
        ).fetchall():
            if str(label) in out:
                out[str(label)].update(generated=int(generated), judged_total=int(judged),
                                       accepted_total=int(kept))
        for label, fill in self._exec(
            conn,
            "SELECT label, COUNT(*) FROM images WHERE pool_id = ? AND accepted = 1"
            " GROUP BY label",
            (pool_id,),
        ).fetchall():
            if str(label) in out:
                out[str(label)]["fill"] = int(fill)
        for label, count in self._exec(
            conn,
            "SELECT label, COALESCE(SUM(count), 0) FROM reservations WHERE pool_id = ?"
            f" AND expires > {self._NOW} GROUP BY label",
            (pool_id,),
        ).fetchall():
            if str(label) in out:
                out[str(label)]["reserved"] = int(count)
        return out

    def get_job(self, job_id: str) -> Job | None:
        """The job with this id, or None."""
        with self._tx(write=False) as conn:
            row = self._exec(conn, f"SELECT {_COLUMNS} FROM jobs WHERE id = ?",
                             (job_id,)).fetchone()
        return None if row is None else _job(row)

    def list_jobs(
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
            unknown = [s for s in states if s not in JOB_STATES]
            if unknown or not states:
                raise ValueError(f"states {list(states)!r}: use some of {list(JOB_STATES)}")
            where.append(f"state IN ({_in(states)})")
            params.extend(states)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        with self._tx(write=False) as conn:
            rows = self._exec(
                conn, f"SELECT {_COLUMNS} FROM jobs{clause} ORDER BY created DESC, id DESC"
                " LIMIT ?", (*params, limit)).fetchall()
        return [_job(row) for row in rows]

    def live_jobs(self, pool_id: str) -> list[Job]:
        """The pool's queued and running jobs, oldest first."""
        with self._tx(write=False) as conn:
            rows = self._exec(
                conn, f"SELECT {_COLUMNS} FROM jobs WHERE pool_id = ? AND {_LIVE}"
                " ORDER BY created, id", (pool_id,)).fetchall()
        return [_job(row) for row in rows]

    def set_state(
        self, job_id: str, state: str, reason: str | None = None, *,
        from_states: Sequence[str] = LIVE_JOB_STATES,
        result: Mapping[str, Any] | None = None,
    ) -> bool:
        """Move the job to ``state`` if it is in one of ``from_states``; True for the one
        caller (of every replica) whose UPDATE did it. A terminal ``state`` sets ``ended`` and,
        when the job has a ``notify_url``, schedules its webhook (``pending``). ``result``:
        the job's progress as it ended (stored as JSON, so an ended job reports what it had
        when it ended, not what the pool gained since)."""
        if state not in JOB_STATES or not from_states or any(
                s not in JOB_STATES for s in from_states):
            raise ValueError(f"state {state!r} / from_states {list(from_states)!r}: use "
                             f"{list(JOB_STATES)}")
        with self._tx(write=True) as conn:
            return self._set_state(conn, job_id, state, reason, from_states, result)

    def _set_state(self, conn: Any, job_id: str, state: str, reason: str | None,
                   from_states: Sequence[str],
                   result: Mapping[str, Any] | None = None) -> bool:
        now = time.time()
        ended = state not in LIVE_JOB_STATES
        cur = self._exec(
            conn,
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

    def cancel_job(self, job_id: str, reason: str = "cancelled by a client", *,
                   result: Mapping[str, Any] | None = None) -> Job:
        """Cancel a live job and release the targets it held (module doc); the job as it is
        now. Raises :class:`~genaug.service.errors.NotFoundError` for an unknown id and
        :class:`~genaug.service.errors.ConflictError` (409) for a job that already ended."""
        with self._tx(write=True) as conn:
            row = self._exec(conn, f"SELECT {_COLUMNS} FROM jobs WHERE id = ?",
                             (job_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"id {job_id[:40]!r}: no such job; GET /v1/jobs lists the "
                                    "recent ones", field="id")
            job = _job(row)
            if job.live:
                for label in sorted(job.asked):
                    self._lock_label(conn, job.pool_id, label)
            if not job.live or not self._set_state(conn, job_id, "cancelled", reason,
                                                   LIVE_JOB_STATES, result):
                state = self._exec(conn, "SELECT state FROM jobs WHERE id = ?",
                                   (job_id,)).fetchone()[0]
                raise ConflictError(
                    f"id {job_id!r}: the job already ended ({state}); there is nothing to "
                    f"cancel. GET /v1/jobs/{job_id} says how it ended, DELETE forgets it; "
                    "start a new fill to ask for more", field="id")
            self._release(conn, job)
            row = self._exec(conn, f"SELECT {_COLUMNS} FROM jobs WHERE id = ?",
                             (job_id,)).fetchone()
        return _job(row)

    def forget_job(self, job_id: str, reason: str = "cancelled, then forgotten, by a client",
                   *, result: Mapping[str, Any] | None = None) -> Job:
        """Remove the job; a live one is cancelled first (its targets released, as
        :meth:`cancel_job` does), in the same transaction. Its webhook, pending or not, is
        never sent. Returns the job as it was when forgotten (cancelled, if it was live);
        :class:`~genaug.service.errors.NotFoundError` for an unknown id."""
        with self._tx(write=True) as conn:
            row = self._exec(conn, f"SELECT {_COLUMNS} FROM jobs WHERE id = ?",
                             (job_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"id {job_id[:40]!r}: no such job; GET /v1/jobs lists the "
                                    "recent ones", field="id")
            job = _job(row)
            if job.live:
                for label in sorted(job.asked):
                    self._lock_label(conn, job.pool_id, label)
                if self._set_state(conn, job_id, "cancelled", reason, LIVE_JOB_STATES,
                                   result):
                    self._release(conn, job)
                job = _job(self._exec(conn, f"SELECT {_COLUMNS} FROM jobs WHERE id = ?",
                                      (job_id,)).fetchone())
            self._exec(conn, "DELETE FROM jobs WHERE id = ?", (job_id,))
        log.info("job %s: forgotten (%s)", job_id, job.state)
        return job

    def _release(self, conn: Any, job: Job) -> None:
        """Lower each label's shared target the cancelled ``job`` held (under the label
        locks the caller took) to max(other live jobs' targets, fill + in flight now)."""
        others = [_job(r) for r in self._exec(
            conn, f"SELECT {_COLUMNS} FROM jobs WHERE pool_id = ? AND {_LIVE} AND id <> ?",
            (job.pool_id, job.id)).fetchall()]
        for label in sorted(job.asked):
            row = self._exec(conn, "SELECT target FROM targets WHERE pool_id = ? AND label = ?",
                             (job.pool_id, label)).fetchone()
            if row is None or int(row[0]) > job.target(label):
                continue  # someone else (a waiting sample, an older genaug) asked for more
            fill, reserved = self._exec(
                conn,
                "SELECT (SELECT COUNT(*) FROM images WHERE pool_id = ? AND label = ?"
                " AND accepted = 1), (SELECT COALESCE(SUM(count), 0) FROM reservations"
                f" WHERE pool_id = ? AND label = ? AND expires > {self._NOW})",
                (job.pool_id, label, job.pool_id, label),
            ).fetchone()
            keep = max([int(fill) + int(reserved)] + [o.target(label) for o in others])
            if keep < int(row[0]):
                self._exec(conn, "UPDATE targets SET target = ? WHERE pool_id = ? AND label = ?",
                           (keep, job.pool_id, label))
                log.info("job %s cancelled: label %s target %d -> %d", job.id, label,
                         int(row[0]), keep)

    def _fail_live_jobs(self, conn: Any, pool_id: str, reason: str) -> int:
        """End every live job of the pool as failed (its pool is gone)."""
        ids = [str(r[0]) for r in self._exec(
            conn, f"SELECT id FROM jobs WHERE pool_id = ? AND {_LIVE}", (pool_id,)).fetchall()]
        return sum(self._set_state(conn, i, "failed", reason, LIVE_JOB_STATES) for i in ids)

    # -- webhooks --------------------------------------------------------------------------

    def claim_webhook(self, owner: str, lease_s: float, *, limit: int = 20) -> list[Job]:
        """Take up to ``limit`` jobs whose webhook is pending and not claimed by a live lease:
        each is ``owner``'s for ``lease_s`` seconds, a lease the store's heartbeat renews
        while ``owner`` lives (:meth:`~genaug.service.pool.store.PoolStore.renew`) and that
        closing the store hands back. Another replica gets it only after the lease, so one
        delivers at a time; a replica that died leaves it after one lease."""
        if lease_s <= 0 or limit < 1:
            raise ValueError(f"lease_s must be > 0 and limit >= 1, got {lease_s}, {limit}")
        free = ("webhook_state = 'pending' AND (webhook_until IS NULL"
                f" OR webhook_until <= {self._NOW})")
        with self._tx(write=True) as conn:
            # The condition again outside the subquery: PostgreSQL re-checks it on a row
            # another replica claimed meanwhile, so a row is never claimed twice.
            rows = self._exec(
                conn,
                f"UPDATE jobs SET webhook_claim = ?, webhook_until = {self._NOW} + ?"
                f" WHERE id IN (SELECT id FROM jobs WHERE {free} ORDER BY ended LIMIT ?)"
                f" AND {free} RETURNING {_COLUMNS}",
                (owner, float(lease_s), limit),
            ).fetchall()
        return sorted((_job(r) for r in rows), key=lambda j: (j.ended or 0.0, j.id))

    def webhook_attempted(self, job_id: str, at: float) -> None:
        """Count one delivery attempt of ``job_id``'s webhook, started at ``at`` (seconds
        since the epoch; the first one's time is kept: the delivery's window runs from it)."""
        with self._tx(write=True) as conn:
            self._exec(conn, "UPDATE jobs SET webhook_attempts = webhook_attempts + 1,"
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
        if delivered or retry_after_s is None:
            sets, params = "webhook_state = ?, webhook_claim = NULL, webhook_until = NULL", [
                "delivered" if delivered else "failed"]
        else:
            sets = f"webhook_claim = NULL, webhook_until = {self._NOW} + ?"
            params = [float(retry_after_s)]
        where = "id = ? AND webhook_state = 'pending'"
        params.append(job_id)
        if owner is not None:
            where += " AND webhook_claim = ?"
            params.append(owner)
        with self._tx(write=True) as conn:
            return int(self._exec(conn, f"UPDATE jobs SET {sets} WHERE {where}",
                                  params).rowcount) == 1
