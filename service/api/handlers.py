"""The one place errors become responses: the app's exception handlers.

Every answer that is not a success has one shape, ``{"error": {"type", "message",
"field"?}}`` (:class:`~genaug.service.api.responses.ErrorBody`); a 422 names the field, the
value, the bound and the fix. Nothing a client can send produces a 500: what does is a bug,
answered with an error id that is also in the log.

Example::

    for exc_class, handler in EXCEPTION_HANDLERS.items():
        app.add_exception_handler(exc_class, handler)
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from ..errors import InvalidRequestError, ServiceError, new_id
from ..intake.parse import describe_validation
from .errors import error_response
from .requests import state_of

log = logging.getLogger(__name__)


async def api_error(request: Request, exc: Exception) -> Response:
    """A :class:`~genaug.service.errors.ServiceError` in its status (the edge's table,
    :mod:`~genaug.service.api.errors`); 422s are counted."""
    assert isinstance(exc, ServiceError)
    if isinstance(exc, InvalidRequestError):
        state_of(request).metrics.rejections.labels("invalid").inc()
    return error_response(exc)


async def validation_error(request: Request, exc: Exception) -> Response:
    """A path or query parameter FastAPI itself validated (bodies are parsed by the routes)."""
    assert isinstance(exc, RequestValidationError)
    state_of(request).metrics.rejections.labels("invalid").inc()
    # The parameter is the field ("limit", not "query"): drop where FastAPI found it.
    errors = [{**e, "loc": tuple(e.get("loc", ()))[1:]}
              if tuple(e.get("loc", ()))[:1] in (("query",), ("path",), ("header",)) else e
              for e in exc.errors()]
    return error_response(describe_validation(errors, [], {}))


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 and 405 (no such path, no such method), in the one shape."""
    assert isinstance(exc, StarletteHTTPException)
    kinds = {404: "not_found", 405: "method_not_allowed"}
    headers = dict(exc.headers or {})
    if exc.status_code == 405:  # every method of the path, not only its first route's
        headers["Allow"] = ", ".join(allowed_methods(request))
    body = {
        "error": {
            "type": kinds.get(exc.status_code, "http_error"),
            "message": f"{request.method} {request.url.path}: {exc.detail}",
        }
    }
    return JSONResponse(body, status_code=exc.status_code, headers=headers)


def allowed_methods(request: Request) -> list[str]:
    """The methods some route serves at the request's path (a path with one route per method,
    ``GET`` and ``DELETE /v1/jobs/{job_id}``, answers 405 from its first route alone)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match is Match.PARTIAL:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


async def unexpected(request: Request, exc: Exception) -> Response:
    """Anything else: a 500 with an error id, and the traceback under that id in the log."""
    error_id = new_id()
    log.exception("unexpected error (error id %s) on %s", error_id, request.url.path)
    body = {
        "error": {
            "type": "internal",
            "id": error_id,
            "message": f"internal error; error id {error_id} is in the log",
        }
    }
    return JSONResponse(body, status_code=500)


EXCEPTION_HANDLERS: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
    ServiceError: api_error,
    RequestValidationError: validation_error,
    StarletteHTTPException: http_error,
    Exception: unexpected,
}
