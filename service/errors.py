"""What went wrong, in the service's own words: the errors every layer below the HTTP edge
raises.

Each says what was received, the bound it broke and how to fix it (``message``); where one
field is at fault, which (``field``); where asking again later may work (a full queue, a start
under way, a pool outage), after how many seconds (``retry_after_s``); and for a failure
logged with its traceback, the id under which (``error_id``). They carry no HTTP status and
import no web framework: the edge (:mod:`~genaug.service.api.errors`) maps each kind to its
status and wire type in one table and writes them in the one JSON shape. Reading a body and
describing what is wrong with it is the intake's (:mod:`~genaug.service.intake.parse`).

Example::

    raise InvalidRequestError("steps 900 > max_steps 150; send at most 150 or set "
                              "GENAUG_MAX_STEPS", field="steps")
    raise QueueFullError("queue holds 512 images; ...", retry_after_s=4)
"""

from __future__ import annotations

import uuid

__all__ = [
    "BodyTooLargeError",
    "ConflictError",
    "DeadlineExceededError",
    "GenerationFailedError",
    "InvalidRequestError",
    "NotFoundError",
    "NotReadyError",
    "PoolFullError",
    "PoolUnavailableError",
    "QueueFullError",
    "ServiceError",
    "ShuttingDownError",
    "UnauthorizedError",
    "new_id",
]


def new_id() -> str:
    """A short random id for a request or an error (12 hex characters), the one place ids are
    made: error ids are both in the answer and in the log, so an operator can find one."""
    return uuid.uuid4().hex[:12]


class ServiceError(Exception):
    """A request the service does not answer with what it asked for (module doc)."""

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        retry_after_s: float | None = None,
        error_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.retry_after_s = retry_after_s
        self.error_id = error_id


class InvalidRequestError(ServiceError):
    """The request itself is wrong: a field out of its bounds, a name nothing has."""


class UnauthorizedError(ServiceError):
    """No API key, or one the service does not hold."""


class NotFoundError(ServiceError):
    """What the request names (a recipe, a job, an image) does not exist."""


class PoolFullError(ServiceError):
    """A valid request the pool has no room for now (``/fill`` with ``images``): it depends
    on the pool's state, not on the body."""


class ConflictError(ServiceError):
    """A valid request the resource's state refuses (cancelling a job that already ended):
    asking again will not help until the state changes."""


class BodyTooLargeError(ServiceError):
    """A body above its route's byte limit."""


class QueueFullError(ServiceError):
    """The generation queue holds as many images as it may; ``retry_after_s`` says when it
    has likely drained."""


class NotReadyError(ServiceError):
    """The service is starting (loading, warming up) or its model failed to load."""


class GenerationFailedError(ServiceError):
    """The pipeline failed for this request's batch; ``error_id`` is also in the log."""


class PoolUnavailableError(ServiceError):
    """The pool database is unreachable (an outage); generation still works."""


class ShuttingDownError(ServiceError):
    """The service is stopping: the request was not run."""


class DeadlineExceededError(ServiceError):
    """The request's deadline (``timeout_s``) passed before its images were made."""
