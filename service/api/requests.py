"""What every route reads from a request besides its body: the app's state, who is asking,
and which answer format they accept.

Bodies are the intake's to read (:mod:`~genaug.service.intake.parse`,
:mod:`~genaug.service.intake.uploads`); keys and body size were checked before any route runs
(:mod:`~genaug.service.api.guard`).

Example::

    state = state_of(request)
    job = batcher.submit(key, items, client=client_identity(request), ...)
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from fastapi import Request

from genaug.wire import CLIENT_ID_PATTERN, PNG_MEDIA_TYPE, SAFETENSORS_MEDIA_TYPE

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


#: Any bytes: every binary answer is also offered under this type, the one that client
#: generators (openapi-python-client) read as bytes without configuration.
OCTET_STREAM = "application/octet-stream"
#: What the batch routes (generate, variants, a recipe's sample) answer, in the service's
#: order of preference: the safetensors batch (also as plain octets), or one PNG grid.
BATCH_MEDIA = (SAFETENSORS_MEDIA_TYPE, PNG_MEDIA_TYPE, OCTET_STREAM)


def negotiate(request: Request, offers: Sequence[str]) -> str:
    """The one of ``offers`` the ``Accept`` header prefers (RFC 9110 section 12.5.1): the
    highest q, each offer's q given by the most specific range that matches it
    (``image/png`` over ``image/*`` over ``*/*``); at equal q the offer matched more
    specifically, then the earlier offer. With no ``Accept``, or none of ``offers``
    acceptable, the first offer: the header is disregarded rather than answered 406, as
    RFC 9110 allows (a client that asks only for JSON still gets the bytes; its errors are
    JSON).

    Example: ``Accept: image/png, */*`` gives ``image/png``; ``*/*`` gives ``offers[0]``."""
    header = request.headers.get("accept")
    if not header:
        return offers[0]
    ranges: list[tuple[str, float]] = []
    for part in header.split(","):
        media, *params = (piece.strip() for piece in part.split(";"))
        if not media:
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = min(1.0, max(0.0, float(value)))
                except ValueError:  # a malformed q accepts nothing rather than everything
                    q = 0.0
        ranges.append((media.lower(), q))
    best, best_key = offers[0], (0.0, -1)
    for offer in offers:
        kind = offer.split("/", 1)[0]
        matches = [(2 if media == offer else 1 if media == f"{kind}/*" else 0, q)
                   for media, q in ranges if media in (offer, f"{kind}/*", "*/*")]
        if not matches:
            continue
        specificity, q = max(matches)  # the most specific range decides the offer's q
        if (q, specificity) > best_key and q > 0:
            best, best_key = offer, (q, specificity)
    return best


def wants_png(request: Request) -> bool:
    """Whether the client prefers one PNG (``Accept: image/png``) to the safetensors batch
    (:data:`BATCH_MEDIA`, :func:`negotiate`)."""
    return negotiate(request, BATCH_MEDIA) == PNG_MEDIA_TYPE


def binary_media(request: Request, media: str) -> str:
    """The ``Content-Type`` of a binary answer whose bytes are ``media``: ``media``, or
    :data:`OCTET_STREAM` when the client prefers plain octets (``Accept:
    application/octet-stream``, which ``/openapi.json`` offers beside every binary type)."""
    return negotiate(request, (media, OCTET_STREAM))


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
