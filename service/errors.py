"""Errors the service answers with, all in one JSON shape.

``{"error": {"type": ..., "message": ..., "field": ...}}``; ``field`` only where one field is
at fault. Every message says what was received, the bound it broke and how to fix it.
Reading a body and describing what is wrong with it is the intake's
(:mod:`~genaug.service.intake.parse`); this module only holds the errors and their one shape.
"""

from __future__ import annotations

import uuid
from typing import Any

from starlette.responses import JSONResponse


def new_id() -> str:
    """A short random id for a request or an error (12 hex characters), the one place ids are
    made: error ids are both in the answer and in the log, so an operator can find one."""
    return uuid.uuid4().hex[:12]


class ApiError(Exception):
    """An answer to the client that is not a success: status, type, message, optional field."""

    status: int = 400
    error_type: str = "bad_request"

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
        error_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.headers = headers or {}
        self.error_id = error_id

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"type": self.error_type, "message": self.message}
        if self.field is not None:
            error["field"] = self.field
        if self.error_id is not None:
            error["id"] = self.error_id
        return {"error": error}


class InvalidRequestError(ApiError):
    status = 422
    error_type = "invalid_request"


class UnauthorizedError(ApiError):
    status = 401
    error_type = "unauthorized"


class NotFoundError(ApiError):
    status = 404
    error_type = "not_found"


class PoolFullError(ApiError):
    """A valid request the pool has no room for now (``/fill`` with ``images``): it depends
    on the pool's state, not on the body, so not a 422."""

    status = 409
    error_type = "pool_full"


class ConflictError(ApiError):
    """A valid request the resource's state refuses (cancelling a job that already ended):
    asking again will not help until the state changes, so a 409, not a 422."""

    status = 409
    error_type = "conflict"


class BodyTooLargeError(ApiError):
    status = 413
    error_type = "body_too_large"


class QueueFullError(ApiError):
    status = 429
    error_type = "queue_full"


class NotReadyError(ApiError):
    status = 503
    error_type = "not_ready"


class GenerationFailedError(ApiError):
    """The pipeline failed for this request's batch; ``error_id`` is also in the log."""

    status = 503
    error_type = "generation_failed"


class PoolUnavailableError(ApiError):
    """The pool database is unreachable (an outage); generation still works. Retry-After."""

    status = 503
    error_type = "pool_unavailable"


class ShuttingDownError(ApiError):
    status = 503
    error_type = "shutting_down"


class DeadlineExceededError(ApiError):
    status = 504
    error_type = "deadline_exceeded"


def error_response(exc: ApiError, *, status: int | None = None) -> JSONResponse:
    """The one JSON error shape, as a response."""
    return JSONResponse(exc.body(), status_code=status or exc.status, headers=exc.headers)

