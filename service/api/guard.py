"""The door of the service: API keys and the body-size limits, before anything is parsed.

``GuardMiddleware`` is a pure ASGI middleware so both checks run before FastAPI reads a body.
It takes plain values (the keys, a body limit for JSON routes, limits per upload route, a
callback that counts rejections), as Starlette's own middleware do. Keys are compared in
constant time (``hmac.compare_digest``, against every configured key) and never logged or
echoed; a key is known elsewhere only by :func:`key_id`, a hash prefix. The probes and the
status page's HTML shell (no data in it) stay open.

Example::

    app.add_middleware(GuardMiddleware, keys=["s3cret"], max_body_bytes=65536,
                       upload_routes={"/v1/variants": 32 << 20},
                       on_reject=lambda reason: print("rejected:", reason))
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import BodyTooLargeError, ServiceError, UnauthorizedError
from .errors import error_response

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/"})
#: Paths under these are open too: the pages (``/pool/{name}``), which hold no data; their
#: scripts send the key to the API.
OPEN_PREFIXES = ("/pool/",)


def is_open(path: str) -> bool:
    """Whether ``path`` is answered without an API key (probes and pages)."""
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


def key_id(key: str) -> str:
    """A stable, non-secret name for an API key (for fairness and metrics, never the key)."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:8]


def presented_key(headers: Any) -> str | None:
    auth = headers.get("authorization")
    if auth and auth.lower().startswith("bearer "):
        return str(auth[7:].strip())
    key = headers.get("x-api-key")
    return str(key) if key else None


def authenticate(keys: Sequence[str], headers: Any) -> str | None:
    """The matching key's id, ``None`` when no keys are configured; raises 401 otherwise.

    Every configured key is compared, in constant time, whatever matches first.
    """
    if not keys:
        return None
    given = presented_key(headers)
    if given is None:
        raise UnauthorizedError(
            "this service requires an API key: send 'Authorization: Bearer <key>' or "
            "'X-API-Key: <key>' (the service's keys are set by GENAUG_API_KEYS; clients "
            "read GENAUG_API_KEY)"
        )
    matched: str | None = None
    given_b = given.encode()
    for key in keys:
        if hmac.compare_digest(given_b, key.encode()):
            matched = key_id(key)
    if matched is None:
        raise UnauthorizedError(
            "the API key sent is not one of this service's keys (GENAUG_API_KEYS); check "
            "GENAUG_API_KEY on the client"
        )
    return matched


class GuardMiddleware:
    """Authentication for every path but the open ones, and a body-size limit before parsing.

    A pure ASGI middleware, so both checks run before FastAPI reads the body. A body without
    ``Content-Length`` (chunked) is read here up to the limit and replayed to the app; one
    that goes past the limit gets 413 without being read further. ``on_reject`` is called
    with ``"auth"`` or ``"body_too_large"`` for each request turned away.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        keys: Sequence[str],
        max_body_bytes: int,
        upload_routes: Mapping[str, int] | None = None,
        on_reject: Callable[[str], None] | None = None,
    ) -> None:
        self.app = app
        self.keys = tuple(keys)
        self.max_body_bytes = max_body_bytes
        self.upload_routes = dict(upload_routes or {})
        self.on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        limit, setting = self.max_body_bytes, "GENAUG_MAX_BODY_BYTES"
        if path in self.upload_routes:
            limit, setting = self.upload_routes[path], "GENAUG_MAX_UPLOAD_BYTES"
        try:
            if self.keys and not is_open(path):
                headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                           for k, v in scope["headers"]}
                scope.setdefault("state", {})["key_id"] = authenticate(self.keys, headers)
            length = _content_length(scope)
            if length is not None and length.isdigit() and int(length) > limit:
                raise _body_too_large(int(length), limit, setting)
            if length is None and scope["method"] in ("POST", "PUT", "PATCH"):
                receive = await _buffered(receive, limit, setting)
        except ServiceError as exc:
            if self.on_reject is not None:
                reason = "body_too_large" if isinstance(exc, BodyTooLargeError) else "auth"
                self.on_reject(reason)
            await error_response(exc)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _content_length(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name.lower() == b"content-length":
            return str(value.decode("latin-1"))
    return None


async def _buffered(receive: Receive, limit: int, setting: str) -> Receive:
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
            raise _body_too_large(len(body), limit, setting)
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


def _body_too_large(size: int, limit: int, setting: str) -> BodyTooLargeError:
    what = "upload" if setting == "GENAUG_MAX_UPLOAD_BYTES" else "request body"
    bound = setting.removeprefix("GENAUG_").lower()
    return BodyTooLargeError(
        f"{what} of {size} bytes exceeds {bound} {limit}; send a smaller body "
        f"(fewer or smaller images, shorter prompts) or set {setting}"
    )
