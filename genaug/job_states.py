"""A fill job's states: the words every side of the wire uses, defined once.

The service stores and serves them (``GET /v1/jobs/{id}``'s ``state``, the ``state`` filter of
``GET /v1/jobs``, an enum in ``/openapi.json``), the clients wait until one of
:data:`ENDED` comes, ``genaug jobs`` lists and filters by them and exits by them, and ``genaug
pregenerate --url`` follows a job to one. A state added here reaches every one of them; a test
pins this tuple to the served schema's enum.

- ``queued``: nothing made for it yet; ``running``: images are being made for it;
- ``done``: every label holds (or gained) what it asked; ``stopped``: the recipe's judge
  stopped a label it still needs; ``failed``: its pool was dropped; ``cancelled``: by a client.

Example::

    from genaug.job_states import ENDED, ended
    ended({"state": "stopped"})   # True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

__all__ = ["CANCELLED", "DONE", "ENDED", "FAILED", "LIVE", "QUEUED", "RUNNING", "STATES",
           "STOPPED", "JobState", "ended"]

#: A job's state, as a type (the served schema's enum).
JobState = Literal["queued", "running", "done", "stopped", "failed", "cancelled"]
#: Every state, live ones first.
STATES: tuple[str, ...] = get_args(JobState)
#: Each state by name, for code that sets or tests one.
QUEUED, RUNNING, DONE, STOPPED, FAILED, CANCELLED = STATES
#: States a job can still leave (it holds its targets while in one of them).
LIVE: tuple[str, ...] = (QUEUED, RUNNING)
#: States a job ends in: a waiter returns at one of these.
ENDED: tuple[str, ...] = tuple(s for s in STATES if s not in LIVE)


def ended(job: Mapping[str, Any]) -> bool:
    """True once ``job`` (a ``GET /v1/jobs/{id}`` answer) is in one of :data:`ENDED`."""
    return str(job.get("state")) in ENDED
