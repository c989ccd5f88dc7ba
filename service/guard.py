"""The door of the service: API keys and the body-size limit, before anything is parsed.

``GuardMiddleware`` is a pure ASGI middleware so both checks run before FastAPI reads a body.
Keys are compared in constant time (``hmac.compare_digest``, against every configured key)
and never logged or echoed; a key is known elsewhere only by :func:`key_id`, a hash prefix.
The probes and the status page's HTML shell (no data in it) stay open.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import ApiError, BodyTooLargeError, UnauthorizedError, error_response

if TYPE_CHECKING:
    from .app import AppState

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/"})


def key_id(key: str) -> str:
    """A stable, non-secret name for an API key (for fairness and metrics, never the key)."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:8]


def presented_key(headers: Any) -> str | None:
    auth = headers.get("authorization")
    if auth and auth.lower().startswith("bearer "):
        return str(auth[7:].strip())
    key = headers.get("x-api-key")
    return str(key) if key else None


def authenticate(state: AppState, headers: Any) -> str | None:
    """The matching key's id, ``None`` when no keys are configured; raises 401 otherwise.

    Every configured key is compared, in constant time, whatever matches first.
    """
    keys = state.settings.api_keys
    if not keys:
        return None
    given = presented_key(headers)
    if given is None:
        state.metrics.rejections.labels("auth").inc()
        raise UnauthorizedError(
            "this service requires an API key: send 'Authorization: Bearer <key>' or "
            "'X-API-Key: <key>' (the service's keys are set by GENAUG_API_KEYS; clients "
            "read GENAUG_API_KEY)"
        )
    matched: str | None = None
    given_b = given.encode()
    for key in keys:
        secret = key.get_secret_value()
        if hmac.compare_digest(given_b, secret.encode()):
            matched = key_id(secret)
    if matched is None:
        state.metrics.rejections.labels("auth").inc()
        raise UnauthorizedError(
            "the API key sent is not one of this service's keys (GENAUG_API_KEYS); check "
            "GENAUG_API_KEY on the client"
        )
    return matched


class GuardMiddleware:
    """Authentication for every path but the open ones, and a body-size limit before parsing.

    A pure ASGI middleware, so both checks run before FastAPI reads the body. A body without
    ``Content-Length`` (chunked) is read here up to the limit and replayed to the app; one
    that goes past the limit gets 413 without being read further.
    """

    def __init__(self, app: ASGIApp, state: AppState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        limit = self.state.settings.max_body_bytes
        try:
            if scope["path"] not in OPEN_PATHS:
                key = authenticate(self.state, headers)
                scope.setdefault("state", {})["key_id"] = key
            length = headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > limit:
                raise _body_too_large(int(length), limit)
            if length is None and scope["method"] in ("POST", "PUT", "PATCH"):
                receive = await _buffered(receive, limit)
        except ApiError as exc:
            if isinstance(exc, BodyTooLargeError):
                self.state.metrics.rejections.labels("body_too_large").inc()
            await error_response(exc)(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def _buffered(receive: Receive, limit: int) -> Receive:
    """Read a body of unknown length up to ``limit``; a receive that replays it."""
    body = bytearray()
    first: Message | None = None
    while True:
        message = await receive()
        if message["type"] != "http.request":
            first = message  # the client left: let the app see that
            break
        body += message.get("body", b"")
        if len(body) > limit:
            raise _body_too_large(len(body), limit)
        if not message.get("more_body", False):
            break
    replay: Message = first or {"type": "http.request", "body": bytes(body), "more_body": False}
    sent = False

    async def replaying() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return replay
        return await receive()

    return replaying


def _body_too_large(size: int, limit: int) -> BodyTooLargeError:
    return BodyTooLargeError(
        f"request body of {size} bytes exceeds max_body_bytes {limit}; send a smaller body "
        "(prompts are limited by GENAUG_MAX_PROMPT_CHARS) or set GENAUG_MAX_BODY_BYTES"
    )
