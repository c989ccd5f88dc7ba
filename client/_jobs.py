"""Fill jobs, without I/O: a fill's answer, a job's path and query, and one wait's decisions.

A fill handed to the service runs there as a job (``GET /v1/jobs/{id}``). :class:`FillAnswer`
is what the fill answered (the clients' ``FillJob`` / ``AsyncFillJob`` add the calls that
follow it); :class:`JobWatch` decides for one wait (its deadline, the delay before the next
poll, whether the job ended, the last answer seen) and hands each poll's answer to an
``on_update`` callback: the clients' progress bar (``_progress``) and ``genaug pregenerate``'s
bars per label are such callbacks. A job's states are :mod:`genaug.job_states`'.

Example::

    watch = JobWatch("j_0123456789abcdef", timeout=60.0, poll_s=1.0)
    while not watch.seen(client.job(watch.job_id)):
        time.sleep(watch.delay())   # raises TimeoutError at the deadline
"""

from __future__ import annotations

import math
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from genaug.job_states import ended

from .errors import DecodeError

#: ``wait()``'s default seconds between polls of ``GET /v1/jobs/{id}``, and ``jobs()``'s
#: default count (the service's own).
JOB_POLL_S = 1.0
JOBS_LIMIT = 50


def job_held(job: Mapping[str, Any]) -> tuple[int, int]:
    """``(held, asked)``: how much of what ``job`` asked its labels hold now (``asked -
    missing``: a ``per_label`` job counts the images its labels held before it began, an
    ``images`` one only those it made), and what it asked."""
    asked = int(job.get("asked") or 0)
    return max(0, asked - int(job.get("missing") or 0)), asked


def job_path(job_id: str) -> str:
    """``/v1/jobs/{job_id}``, the id quoted (an id with a ``/`` is a 404, never another
    route).

    Raises:
        ValueError: an empty id (it would name the list, not a job).
    """
    if not isinstance(job_id, str) or not job_id:
        raise ValueError(f"job id {job_id!r}: give the id a fill answered (fill(...).id: 'j_' "
                         "and 16 hex characters); jobs() lists the recent ones")
    return "/v1/jobs/" + urllib.parse.quote(job_id, safe="")


def jobs_query(recipe: str | None, state: str | None, limit: int) -> str:
    """``GET /v1/jobs``' query string (only the filters given)."""
    query = {key: value for key, value in (("recipe", recipe), ("state", state))
             if value is not None}
    query["limit"] = str(int(limit))
    return "?" + urllib.parse.urlencode(query)


class FillAnswer(Mapping[str, Any]):
    """What a fill answered: the recipe's counts and targets at once (read it as a mapping:
    ``job["budget"]``, ``job["fill"]``, ``dict(job)``), and the job the service carries the
    fill out as (``id``, ``url``). :class:`~genaug.client.FillJob` and
    :class:`~genaug.client.AsyncFillJob` add ``status()``, ``wait()`` and ``cancel()``.

    ``id`` is ``None`` only from a service older than jobs (its answer names none): the fill
    still runs there, but there is nothing to follow or cancel.
    """

    def __init__(self, answer: Mapping[str, Any]) -> None:
        self.answer: dict[str, Any] = dict(answer)
        job = self.answer.get("job")
        found = isinstance(job, Mapping) and isinstance(job.get("id"), str)
        self.id: str | None = str(job["id"]) if found and isinstance(job, Mapping) else None
        self.url: str | None = (str(job["url"]) if found and isinstance(job, Mapping)
                                and job.get("url") else None)

    def __getitem__(self, key: str) -> Any:
        return self.answer[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.answer)

    def __len__(self) -> int:
        return len(self.answer)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, recipe={self.answer.get('name')!r})"

    def _job_id(self) -> str:
        if self.id is None:
            raise DecodeError(
                f"the service's fill answer names no job (keys: {sorted(self.answer)}): it is "
                "older than this client, so there is nothing to follow or cancel; watch "
                "recipe(name)['fill'] instead, or upgrade the service")
        return self.id


#: What a wait hands each poll's answer to (``GET /v1/jobs/{id}``, a dict).
OnUpdate = Callable[[dict[str, Any]], object]


class JobWatch:
    """One wait for a job, without I/O: its deadline, the delay before the next poll, whether
    the job ended, and the last answer seen. ``_flows.wait_job`` polls; this decides.

    ``on_update``: called with every poll's answer, the last one (the job ended) included,
    before the wait returns; a progress bar or a log line hangs here, never in this class
    (the clients attach their bar with ``_progress.job_bar``).

    Example::

        watch = JobWatch("j_0123456789abcdef", timeout=60.0, poll_s=1.0,
                         on_update=lambda job: print(job["state"]))
        while not watch.seen(client.job(watch.job_id)):
            time.sleep(watch.delay())   # raises TimeoutError at the deadline
    """

    def __init__(self, job_id: str, *, timeout: float | None, poll_s: float,
                 on_update: OnUpdate | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        job_path(job_id)  # the id is one before anything waits
        if not (isinstance(poll_s, int | float) and math.isfinite(poll_s) and poll_s > 0):
            raise ValueError(f"poll_s={poll_s!r}: give the seconds between polls, a number > 0 "
                             f"(default {JOB_POLL_S:g})")
        if timeout is not None and not (isinstance(timeout, int | float) and timeout >= 0):
            raise ValueError(f"timeout={timeout!r}: give seconds >= 0, or None to wait until "
                             "the job ends")
        self.job_id = job_id
        self.timeout = timeout
        self.poll_s = float(poll_s)
        self._clock = clock
        self.deadline = None if timeout is None else clock() + float(timeout)
        self.last: Mapping[str, Any] | None = None
        self.on_update = on_update

    def seen(self, job: dict[str, Any]) -> bool:
        """Record a poll's answer (``on_update`` gets it); True when the job ended."""
        self.last = job
        if self.on_update is not None:
            self.on_update(job)
        return ended(job)  # done, stopped, failed or cancelled: genaug.job_states

    def delay(self) -> float:
        """Seconds to sleep before the next poll.

        Raises:
            TimeoutError: the deadline passed; the message names the job and its state.
        """
        if self.deadline is None:
            return self.poll_s
        remaining = self.deadline - self._clock()
        if remaining <= 0:
            raise TimeoutError(self.timeout_message())
        return min(self.poll_s, remaining)

    def timeout_message(self) -> str:
        job = self.last or {}
        held, asked = job_held(job)
        return (f"job {self.job_id} is still {job.get('state', 'unknown')} after "
                f"{self.timeout:g} s ({held} of {asked} images); it goes on in the service: "
                f"wait again, or cancel it (cancel_job({self.job_id!r}), or genaug jobs cancel "
                f"{self.job_id})")
