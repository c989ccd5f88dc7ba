"""Errors the service answers with, all in one JSON shape.

``{"error": {"type": ..., "message": ..., "field": ...}}``; ``field`` only where one field is
at fault. Every message says what was received, the bound it broke and how to fix it.
"""

from __future__ import annotations

from typing import Any


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


class InvalidRequest(ApiError):
    status = 422
    error_type = "invalid_request"


class Unauthorized(ApiError):
    status = 401
    error_type = "unauthorized"


class NotFound(ApiError):
    status = 404
    error_type = "not_found"


class BodyTooLarge(ApiError):
    status = 413
    error_type = "body_too_large"


class QueueFull(ApiError):
    status = 429
    error_type = "queue_full"


class NotReady(ApiError):
    status = 503
    error_type = "not_ready"


class GenerationFailed(ApiError):
    """The pipeline failed for this request's batch; ``error_id`` is also in the log."""

    status = 503
    error_type = "generation_failed"


class ShuttingDown(ApiError):
    status = 503
    error_type = "shutting_down"


class DeadlineExceeded(ApiError):
    status = 504
    error_type = "deadline_exceeded"
