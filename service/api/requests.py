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

from fastapi import Request

from genaug.wire import PNG_MEDIA_TYPE, SAFETENSORS_MEDIA_TYPE

from ..errors import InvalidRequestError
from .state import AppState

CLIENT_ID_PATTERN = r"^[A-Za-z0-9._:@/-]{1,64}$"
_CLIENT_ID = re.compile(CLIENT_ID_PATTERN)


def state_of(request: Request) -> AppState:
    """The app's state: the one place handlers read it from."""
    state: AppState = request.state.genaug
    return state


def client_identity(request: Request) -> str:
    """Who is asking, for round-robin fairness: the API key's id and/or ``X-Client-Id``."""
    given = request.headers.get("x-client-id")
    if given is not None and not _CLIENT_ID.match(given):
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


def wants_png(request: Request) -> bool:
    """Whether the client asked for one PNG (``Accept: image/png``) rather than safetensors."""
    accept = request.headers.get("accept", "")
    return PNG_MEDIA_TYPE in accept and SAFETENSORS_MEDIA_TYPE not in accept
