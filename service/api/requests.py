"""What every route reads from a request besides its body: the app's state, who is asking,
and whether its query names only parameters the route takes. Which answer format a request
accepts is :mod:`~genaug.service.api.negotiation`'s.

Bodies are the intake's to read (:mod:`~genaug.service.intake.parse`,
:mod:`~genaug.service.intake.uploads`); keys and body size were checked before any route runs
(:mod:`~genaug.service.api.guard`).

Example::

    state = state_of(request)
    job = batcher.submit(key, items, client=client_identity(request), ...)
"""

from __future__ import annotations

import re

from fastapi import Request

from genaug.wire import CLIENT_ID_PATTERN

from ..errors import InvalidRequestError
from .state import AppState

_CLIENT_ID = re.compile(CLIENT_ID_PATTERN)


def state_of(request: Request) -> AppState:
    """The app's state: the one place handlers read it from."""
    state: AppState = request.state.genaug
    return state


def client_identity(request: Request) -> str:
    """Who is asking, for round-robin fairness: the API key's id and/or ``X-Client-Id``."""
    given = request.headers.get("x-client-id")
    if given is not None and not _CLIENT_ID.fullmatch(given):  # "$" passes a last "\n"
        raise InvalidRequestError(
            f"X-Client-Id {given[:80]!r} is not 1-64 characters of letters, digits and "
            "'._:@/-'; send a short name such as 'trainer-a'",
            field="X-Client-Id",
        )
    key = getattr(request.state, "key_id", None)
    if key and given:
        return f"{key}/{given}"
    if key:
        return str(key)
    if given:
        return given
    host = request.client.host if request.client else "unknown"
    return f"ip:{host}"


def known_query(request: Request) -> None:
    """A dependency of the routes that take query parameters: one the route does not take
    is a 422 naming it and those it takes, as an unknown body field is (a misspelt filter,
    ``?recipes=digits``, would otherwise list everything, silently). Routes that take none
    leave query strings alone (a browser's cache-buster, the pool page's ``per_page``)."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    taken = [param.alias for param in getattr(dependant, "query_params", ())]
    unknown = [name for name in request.query_params if name not in taken]
    if unknown:
        raise InvalidRequestError(
            f"unknown query parameter {unknown[0][:80]!r}; remove it (allowed: "
            f"{', '.join(taken)})", field=unknown[0][:80])
