"""The HTTP edge's one table of errors: each service error's status and wire type, and the one
JSON shape they are answered in.

``{"error": {"type": ..., "message": ..., "field": ..., "id": ...}}``; ``field`` only where one
field is at fault, ``id`` only for a failure logged under it. Below this package, code raises
the domain errors of :mod:`~genaug.service.errors`, which know no status; :data:`ANSWERS` is
where each becomes one (a kind not in it is looked up by its bases: a new error is a 400 until
it has its row). A ``retry_after_s`` becomes ``Retry-After`` (whole seconds, at least 1).

Example::

    status_of(QueueFullError("..."))          # 429
    error_response(exc)                       # the JSONResponse a handler returns
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from starlette.responses import JSONResponse

from ..errors import (
    BodyTooLargeError,
    ConflictError,
    DeadlineExceededError,
    GenerationFailedError,
    InvalidRequestError,
    NotFoundError,
    NotReadyError,
    PoolFullError,
    PoolUnavailableError,
    QueueFullError,
    ServiceError,
    ShuttingDownError,
    UnauthorizedError,
)
from .negotiation import NotAcceptableError

__all__ = ["ANSWERS", "Answer", "answer_of", "error_body", "error_response", "status_of"]


class Answer(NamedTuple):
    """How one kind of error is answered: its status, its wire ``type`` and any header its
    status calls for."""

    status: int
    type: str
    headers: tuple[tuple[str, str], ...] = ()


ANSWERS: dict[type[ServiceError], Answer] = {
    ServiceError: Answer(400, "bad_request"),
    UnauthorizedError: Answer(401, "unauthorized"),
    NotFoundError: Answer(404, "not_found"),
    NotAcceptableError: Answer(406, "not_acceptable", (("Vary", "Accept"),)),
    ConflictError: Answer(409, "conflict"),
    PoolFullError: Answer(409, "pool_full"),
    BodyTooLargeError: Answer(413, "body_too_large"),
    InvalidRequestError: Answer(422, "invalid_request"),
    QueueFullError: Answer(429, "queue_full"),
    NotReadyError: Answer(503, "not_ready"),
    GenerationFailedError: Answer(503, "generation_failed"),
    PoolUnavailableError: Answer(503, "pool_unavailable"),
    ShuttingDownError: Answer(503, "shutting_down"),
    DeadlineExceededError: Answer(504, "deadline_exceeded"),
}
"""Every service error's answer, by kind (module doc)."""


def answer_of(exc: ServiceError) -> Answer:
    """``exc``'s row of :data:`ANSWERS`: its own kind's, else its nearest base's."""
    for kind in type(exc).__mro__:
        found = ANSWERS.get(kind)
        if found is not None:
            return found
    raise TypeError(f"not a service error: {type(exc).__name__}")  # pragma: no cover


def status_of(exc: ServiceError) -> int:
    """The HTTP status ``exc`` is answered with."""
    return answer_of(exc).status


def error_body(exc: ServiceError) -> dict[str, Any]:
    """The one JSON shape (module doc)."""
    error: dict[str, Any] = {"type": answer_of(exc).type, "message": exc.message}
    if exc.field is not None:
        error["field"] = exc.field
    if exc.error_id is not None:
        error["id"] = exc.error_id
    return {"error": error}


def error_response(exc: ServiceError) -> JSONResponse:
    """``exc`` as a response: its status, the one shape, and its headers."""
    answer = answer_of(exc)
    headers = dict(answer.headers)
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    return JSONResponse(error_body(exc), status_code=answer.status, headers=headers)
