"""The pool sample's fast path, :class:`DirectSample`: ``POST /v1/recipes/{name}/sample``
answered straight from the ASGI call. One pure-ASGI middleware in its own file, as Starlette
keeps its own; the guard (:mod:`~genaug.service.api.guard`) is the other.
"""

from __future__ import annotations

from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import ServiceError
from .handlers import api_error
from .recipes import sample


class DirectSample:
    """Serves ``POST /v1/recipes/{name}/sample`` straight from the ASGI call, past Starlette's
    router and FastAPI's dependency solving (about 0.1 ms of a pool sample's ~1 ms in the
    service). A pure ASGI middleware inside :class:`~genaug.service.api.guard.GuardMiddleware`:
    keys and body limits are checked before it. Every other request, and any path it does
    not recognise exactly, goes on to the app; the FastAPI route
    (:func:`~genaug.service.api.recipes.sample`, the handler this calls) stays registered,
    and documents the operation in ``/openapi.json``. Errors take the app's handlers:
    :class:`~genaug.service.errors.ServiceError` here (the same
    :func:`~genaug.service.api.handlers.api_error`), anything unexpected propagates to the
    app's 500 handler.

    Example::

        app.add_middleware(DirectSample)   # before GuardMiddleware, so the guard runs first
    """

    PREFIX, SUFFIX = "/v1/recipes/", "/sample"

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = self._recipe(scope)
        if name is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response = await sample(name, request)
        except ServiceError as exc:
            response = await api_error(request, exc)
        await response(scope, receive, send)

    def _recipe(self, scope: Scope) -> str | None:
        """The recipe name when ``scope`` is exactly the sample route, else ``None``."""
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            return None
        path: str = scope["path"]
        if not (path.startswith(self.PREFIX) and path.endswith(self.SUFFIX)):
            return None
        name = path[len(self.PREFIX) : -len(self.SUFFIX)]
        return name if name and "/" not in name else None
