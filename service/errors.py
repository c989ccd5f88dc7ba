"""Errors the service answers with, all in one JSON shape.

``{"error": {"type": ..., "message": ..., "field": ...}}``; ``field`` only where one field is
at fault. Every message says what was received, the bound it broke and how to fix it.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse


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


def unparseable(cause: BaseException) -> str:
    """Why FastAPI could not read a JSON body, and what to send instead."""
    detail = f"{type(cause).__name__}: {str(cause)[:120]}"
    if isinstance(cause, RecursionError):
        return f"the body's JSON is nested too deeply ({detail}); send a flat JSON object"
    if isinstance(cause, UnicodeDecodeError):
        return f"the body is not valid UTF-8 ({detail}); send a UTF-8 encoded JSON object"
    if "digits" in str(cause):
        return f"a number in the body has too many digits ({detail}); send numbers in range"
    return f"the body could not be parsed ({detail}); send a UTF-8 JSON object"


# -- validation messages ----------------------------------------------------------------------

_HINTS = {
    "height": "use a multiple of 8 between 8 and max_side (GET /v1/info lists the limits)",
    "width": "use a multiple of 8 between 8 and max_side (GET /v1/info lists the limits)",
    "output_height": "use a positive size up to max_side, with output_width",
    "output_width": "use a positive size up to max_side, with output_height",
    "n": "ask for 1 to max_n images",
    "steps": "use 1 to max_steps steps",
    "guidance": "use a number from 0 to 50",
    "seed": "use an integer from 0 to 2**63-1, or leave it out for random seeds",
    "priority": "use 'interactive' or 'bulk'",
    "timeout_s": "use a positive number of seconds",
    "prompt": "send a non-empty string",
    "negative_prompt": "send a string or leave it out",
}


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def describe_validation(errors: list[Any], allowed: list[str]) -> InvalidRequestError:
    """Turn pydantic's errors into one message naming field, value, bound and fix."""
    messages: list[str] = []
    first_field: str | None = None
    for error in errors[:5]:
        loc = [str(part) for part in error.get("loc", ()) if part != "body"]
        name = ".".join(loc)
        kind = error.get("type", "")
        if kind == "json_invalid":
            detail = (error.get("ctx") or {}).get("error", "invalid JSON")
            messages.append(f"the body is not valid JSON ({detail}); send a JSON object")
            continue
        first_field = first_field or name or None
        if kind == "extra_forbidden":
            messages.append(f"unknown field {name!r}; remove it (allowed: {', '.join(allowed)})")
        elif kind == "missing":
            messages.append(f"{name} is required; {_HINTS.get(name, 'add it')}")
        elif not name:
            messages.append(f"the body must be a JSON object: {error.get('msg')}")
        else:
            hint = _HINTS.get(name, "see GET /v1/info and /docs for valid values")
            messages.append(f"{name} = {_short(error.get('input'))}: {error.get('msg')}; {hint}")
    if len(errors) > 5:
        messages.append(f"and {len(errors) - 5} more problems")
    return InvalidRequestError("; ".join(messages) or "invalid request", field=first_field)
