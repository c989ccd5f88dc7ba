"""The I/O-free core both clients share: which services (URLs), what every request carries
(headers: the API key, the client id), and the one place errors are translated (no answer,
an error status). ``Client`` and ``AsyncClient`` only send requests and sleep; every decision
is made here or in the modules beside it, once: the calls (``_calls``), what they send
(``_options``) and answer (``_results``), replica choice and retry timing (``_retry``), fill
jobs (``_jobs``), and the steps of each operation between them (``_flows``).

Example::

    base = BaseClient("http://127.0.0.1:8000", api_key=None, client_id="trainer-a",
                      timeout=60.0, retry_deadline=30.0)
    base.headers()              # {"User-Agent": "genaug-client", "X-Client-Id": "trainer-a"}
    call = base.calls.info()    # what Client.info() sends
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from typing import Any

from genaug.urls import url_refusal
from genaug.wire import CLIENT_ID_PATTERN

from ._calls import Calls
from ._retry import Endpoint, Endpoints, RetryState
from .errors import (
    KEY_HINT,
    URL_ARGUMENT,
    StatusError,
    TransportError,
    UnavailableError,
    error_class,
)

DEFAULT_URL = "http://127.0.0.1:8000"


def _env_urls() -> list[str]:
    """``GENAUG_URL``'s URLs; the default URL when it is unset or lists none."""
    raw = os.environ.get("GENAUG_URL", "")
    return [u.strip() for u in raw.split(",") if u.strip()] or [DEFAULT_URL]


def _client_id_fix(given: str) -> str:
    """``given`` made a valid client id: other characters become '-', cut to 64."""
    return (re.sub(r"[^A-Za-z0-9._:@/-]+", "-", given).strip("-")[:64]) or "trainer-a"


class BaseClient:
    """Shared, I/O-free state of a client. A URL that is no service URL (``url``, an entry of
    a list of replicas, or of ``GENAUG_URL`` in their place) is a ``ValueError`` naming
    ``owner``'s argument, the value and the fix, raised here: sent, it would only be answered
    by "no answer" after the retries."""

    def __init__(
        self,
        url: str | Sequence[str] | None,
        *,
        api_key: str | None,
        client_id: str | None,
        timeout: float,
        retry_deadline: float,
        owner: str = "Client",
    ) -> None:
        refused = url_refusal(url, owner=owner)
        if refused is not None:
            raise ValueError(refused)
        urls = ([url] if isinstance(url, str) else list(url) if url is not None
                else _env_urls())
        self.endpoints = Endpoints([u.strip() for u in urls])
        self.api_key = api_key if api_key is not None else os.environ.get("GENAUG_API_KEY")
        if client_id is not None and not re.fullmatch(CLIENT_ID_PATTERN, client_id):
            raise ValueError(
                f"client_id {client_id[:80]!r} is not 1-64 characters of letters, digits and "
                f"'._:@/-'; use a short name such as {_client_id_fix(client_id)!r}")
        self.client_id = client_id
        self.timeout = timeout
        self.retry_deadline = retry_deadline
        self.calls = Calls(timeout)

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self.endpoints.endpoints]

    def headers(self, accept: str | None = None) -> dict[str, str]:
        out = {"User-Agent": "genaug-client"}
        if self.api_key:
            out["Authorization"] = f"Bearer {self.api_key}"
        if self.client_id:
            out["X-Client-Id"] = self.client_id
        if accept:
            out["Accept"] = accept
        return out

    def retry_state(self, deadline_s: float | None = None) -> RetryState:
        return RetryState(deadline_s=self.retry_deadline if deadline_s is None else deadline_s)

    def transport_error(self, exc: Exception, endpoint: Endpoint) -> TransportError:
        self.endpoints.mark_down(endpoint)
        return TransportError(
            f"no answer from the genaug service at {endpoint.url} ({type(exc).__name__}: "
            f"{exc}). Is it running? Start one with `genaug serve` (or `docker compose up`), "
            f"or point the client at it with {URL_ARGUMENT} / GENAUG_URL"
        )

    def status_error(
        self, status: int, body: bytes, headers: Any, endpoint: Endpoint
    ) -> StatusError:
        """Translate an error answer; marks the replica down on 503."""
        error_type, message, field_name, error_id = "", "", None, None
        try:
            detail = json.loads(body)["error"]
            error_type = str(detail.get("type", ""))
            message = str(detail.get("message", ""))
            field_name = detail.get("field")
            error_id = detail.get("id")
        except (ValueError, KeyError, TypeError):
            message = body[:200].decode("utf-8", "replace")
        retry_after = None
        raw = headers.get("retry-after")
        if raw is not None:
            try:
                retry_after = float(raw)
            except ValueError:
                retry_after = None
        cls = error_class(status)
        if cls is UnavailableError:
            self.endpoints.mark_down(endpoint)
        text = f"{status} from {endpoint.url}: {message or error_type or 'error'}"
        if status == 401:
            text += KEY_HINT
        return cls(
            text, status=status, error_type=error_type, field=field_name, error_id=error_id,
            retry_after=retry_after, url=endpoint.url,
        )

    def can_fail_over(self) -> bool:
        """True when several replicas are configured and one is healthy now."""
        return len(self.endpoints.endpoints) > 1 and self.endpoints.healthy_count() > 0
