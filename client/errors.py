"""The errors a genaug client raises, in one small tree::

    GenaugError                      anything below; catch this to catch all
    ├── TransportError               no answer: refused, reset, timed out, name not found
    ├── StatusError                  the service answered with an error status
    │   ├── InvalidRequestError      400/413/422: the request is wrong; fix it (not retried)
    │   │   └── ConflictError        409: not now: the pool has no room, the job already ended
    │   ├── AuthenticationError      401: missing or wrong API key
    │   ├── NotFoundError            404: no such route, recipe or job
    │   ├── RateLimitedError         429: queue full (retried, honouring Retry-After)
    │   ├── UnavailableError         503: loading, shutting down, or a failed batch (retried)
    │   ├── DeadlineExceededError    504: the request's timeout_s passed (not retried)
    │   └── ServerError              other 5xx
    └── DecodeError                  a 200 whose body is not what genaug sends

Status errors carry ``status``, ``error_type``, ``field`` (the request field at fault, if
any), ``error_id`` (also in the service log) and ``retry_after`` (seconds, if given).
"""

from __future__ import annotations


class GenaugError(Exception):
    """Base of every error raised by the genaug clients."""


class TransportError(GenaugError):
    """The service could not be reached or did not answer in time."""


class DecodeError(GenaugError):
    """A success response whose body could not be decoded."""


class StatusError(GenaugError):
    """The service answered with an error status."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        error_type: str = "",
        field: str | None = None,
        error_id: str | None = None,
        retry_after: float | None = None,
        url: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.error_type = error_type
        self.field = field
        self.error_id = error_id
        self.retry_after = retry_after
        self.url = url


class InvalidRequestError(StatusError):
    """400, 413 or 422: the request breaks a bound; the message says which and how to fix it."""


class ConflictError(InvalidRequestError):
    """409: the request is valid but the service's state refuses it: a fill with no room left,
    a cancel of a job that already ended (the message names its state). Not retried: the
    state will not change by itself."""


class AuthenticationError(StatusError):
    """401: pass ``api_key=...`` or set ``GENAUG_API_KEY`` to one of the service's keys."""


class NotFoundError(StatusError):
    """404: no such route, recipe or job."""


class RateLimitedError(StatusError):
    """429: the service's queue is full."""


class UnavailableError(StatusError):
    """503: the service is loading, shutting down, or failed this request's batch."""


class DeadlineExceededError(StatusError):
    """504: the request did not finish within its ``timeout_s``."""


class ServerError(StatusError):
    """Any other 5xx."""


_BY_STATUS: dict[int, type[StatusError]] = {
    400: InvalidRequestError,
    401: AuthenticationError,
    403: AuthenticationError,
    404: NotFoundError,
    409: ConflictError,
    413: InvalidRequestError,
    422: InvalidRequestError,
    429: RateLimitedError,
    503: UnavailableError,
    504: DeadlineExceededError,
}


def error_class(status: int) -> type[StatusError]:
    """The class for an HTTP status (the one place statuses are translated)."""
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return ServerError if status >= 500 else InvalidRequestError


#: How the clients' fixes name their own arguments (``Client(url=..., api_key=...)``): a
#: command that runs a client says its flags instead (:func:`for_command`).
URL_ARGUMENT = "url=..."
KEY_HINT = " (pass api_key=... or set GENAUG_API_KEY)"


def for_command(message: str, *, url: str | None = None, api_key: str | None = None) -> str:
    """``message`` (a client error's) as a command prints it: the client's ``url=...``
    becomes the command's ``url`` flag (``"--url URL"``), and the 401 fix names its
    ``api_key`` flag (``"--api-key KEY"``), or only ``GENAUG_API_KEY`` when it has none.

    Example::

        for_command(str(exc), url="--url URL", api_key="--api-key KEY")
    """
    if url is not None:
        message = message.replace(URL_ARGUMENT, url)
    key = (f" (pass {api_key} or set GENAUG_API_KEY)" if api_key is not None
           else " (set GENAUG_API_KEY)")
    return message.replace(KEY_HINT, key)
