"""Errors the service answers with, all in one JSON shape.

``{"error": {"type": ..., "message": ..., "field": ...}}``; ``field`` only where one field is
at fault. Every message says what was received, the bound it broke and how to fix it.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.responses import JSONResponse

M = TypeVar("M", bound=BaseModel)


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


def unparseable(detail: str, raw: bytes) -> str:
    """Why a body is not JSON, and what to send instead."""
    detail = detail[:160]
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"the body is not valid UTF-8 ({exc}); send a UTF-8 encoded JSON object"
    if not raw.strip():
        return "the body is empty; send a JSON object (see GET /openapi.json)"
    if "recursion" in detail:
        return f"the body's JSON is nested too deeply ({detail}); send a flat JSON object"
    where = _field_at(detail, raw)
    if "number" in detail and ("large" in detail or "digits" in detail or "range" in detail):
        return (f"a number{where} has too many digits to parse ({detail}); send numbers "
                "within the bounds in GET /openapi.json")
    if "escape" in detail or "surrogate" in detail:
        return (f"a \\u escape{where} is not a whole character, such as a lone UTF-16 "
                f"surrogate ({detail}); send valid Unicode text")
    return f"the body is not valid JSON ({detail}{where and ';' + where}); send a UTF-8 JSON object"


_POSITION = re.compile(r"line (\d+) column (\d+)")
_KEY = re.compile(r'"((?:[^"\\]|\\.){1,64})"\s*:')


def _field_at(detail: str, raw: bytes) -> str:
    """`` in the value of `name``` for the object key nearest before the parse error's
    position, or "" when there is none (the position is only a hint; this never raises)."""
    found = _POSITION.search(detail)
    if not found:
        return ""
    line, column = int(found.group(1)), int(found.group(2))
    lines = raw.decode("utf-8", "replace").split("\n")
    if not 1 <= line <= len(lines):
        return ""
    before = "\n".join(lines[: line - 1] + [lines[line - 1][:column]])
    before = before.rstrip("0123456789.eE+- ")[-4096:]  # a long number's own digits
    keys = _KEY.findall(before)
    return f" in the value of `{keys[-1]}`" if keys else ""


# -- validation messages ----------------------------------------------------------------------


def _short(value: Any) -> str:
    try:
        text = json.dumps(value) if not isinstance(value, str) else repr(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def parse_json(
    model: type[M], raw: bytes, hints: Mapping[str, str], *, part: str | None = None
) -> M:
    """``raw`` validated by ``model``, else :class:`InvalidRequestError`: why the bytes are not
    JSON (:func:`unparseable`), or the field, value, bound and fix (:func:`describe_validation`).
    ``part`` names the multipart part the JSON came in; messages then start with it.

    Example::

        body = parse_json(api.sample["digits"], await request.body(), api.hints["sample"])
    """
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        prefix = f"{part} part: " if part else ""
        if errors and errors[0]["type"] == "json_invalid":
            detail = str(errors[0].get("ctx", {}).get("error", errors[0]["msg"]))
            raise InvalidRequestError(prefix + unparseable(detail, raw), field=part) from None
        error = describe_validation(errors, sorted(model.model_fields), hints)
        if prefix:
            error.message = prefix + error.message
            error.args = (error.message,)
        raise error from None


def describe_validation(
    errors: list[Any], allowed: list[str], hints: Mapping[str, str]
) -> InvalidRequestError:
    """Turn pydantic's errors into one message naming field, value, bound and fix.

    ``allowed`` lists the body's fields (for unknown-field messages); ``hints`` gives the fix
    per field (built from the running settings, so it names the setting that raises a bound).
    """
    messages: list[str] = []
    first_field: str | None = None
    for error in errors[:5]:
        loc = [str(part) for part in error.get("loc", ()) if part != "body"]
        name = loc[0] if loc else ""
        path = ".".join(loc)
        kind = error.get("type", "")
        first_field = first_field or name or None
        if kind == "extra_forbidden":
            messages.append(f"unknown field {path!r}; remove it (allowed: {', '.join(allowed)})")
        elif kind == "missing":
            messages.append(f"{path} is required; {hints.get(name, 'add it')}")
        elif not name:
            messages.append(f"the body must be a JSON object: {error.get('msg')}")
        elif kind == "string_pattern_mismatch":
            # The API's one pattern is the prompt's "not only spaces" (a character class too
            # long to show); the hint says what to send.
            hint = hints.get(name, "see /openapi.json for the pattern")
            messages.append(f"{path} = {_short(error.get('input'))}: has only space characters; "
                            f"{hint}")
        else:
            hint = hints.get(name, "see GET /v1/info and /docs for valid values")
            messages.append(f"{path} = {_short(error.get('input'))}: {error.get('msg')}; {hint}")
    if len(errors) > 5:
        messages.append(f"and {len(errors) - 5} more problems")
    return InvalidRequestError("; ".join(messages) or "invalid request", field=first_field)
