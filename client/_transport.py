"""``StdlibTransport``: an httpx transport on the standard library's ``http.client``, which the
sync :class:`~genaug.client.Client` mounts for plain ``http://`` services.

Why. A pool sample is one small POST and one body of up to a few MB over a LAN or loopback,
many times a second. httpcore (httpx's default transport) reads a body in 64 KiB pieces and
joins them, and keeps a connection pool of its own in Python; ``http.client`` reads a body of
known length with one ``readinto``. Measured side by side on loopback (``docs/benchmarks.md``,
"What a sample call costs over HTTP"), a 786 KB sample takes about 2-3 ms less, a small call
a few tenths of a millisecond less. httpx stays the client's interface: requests, responses,
timeouts and the exceptions the retries act on are httpx's.

What it leaves to httpx's own transport: ``https://`` (TLS, certificates) and proxies. The
client mounts this transport only for ``http://`` and only when no proxy is configured in the
environment (``HTTP_PROXY``, ``ALL_PROXY``); see :func:`mounts`.

Connections are kept alive, at most ``max_idle`` per origin; one is checked before reuse
(a server that closed an idle keep-alive connection makes it readable at EOF) and a broken one
is dropped, never reused.
"""

from __future__ import annotations

import http.client
import select
import threading
import urllib.request
from typing import Any

import httpx

__all__ = ["StdlibTransport", "mounts"]


def mounts() -> dict[str, httpx.BaseTransport]:
    """The ``mounts`` for an ``httpx.Client``: this transport for ``http://``, unless the
    environment configures a proxy for plain HTTP (httpx then routes it, as it would)."""
    proxies = urllib.request.getproxies()
    if "http" in proxies or "all" in proxies:
        return {}
    return {"http://": StdlibTransport()}


class StdlibTransport(httpx.BaseTransport):
    """Plain-HTTP/1.1 requests over kept-alive ``http.client`` connections; thread-safe.

    Example::

        http = httpx.Client(mounts={"http://": StdlibTransport()})
        http.post("http://127.0.0.1:8000/v1/recipes/wounds/sample", json={"n": 64})
    """

    def __init__(self, *, max_idle: int = 8) -> None:
        self.max_idle = max_idle
        self._idle: dict[tuple[str, int], list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            raise httpx.UnsupportedProtocol(
                f"StdlibTransport serves http:// only, not {url.scheme}://", request=request
            )
        origin = (url.host, url.port or 80)
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        body = request.read()
        conn = self._checkout(origin, request, timeouts.get("connect"))
        write_error: OSError | None = None
        try:
            conn.sock.settimeout(timeouts.get("write"))
            conn.putrequest(request.method, url.raw_path.decode("ascii"),
                            skip_host=True, skip_accept_encoding=True)
            for name, value in request.headers.raw:
                conn.putheader(name, value)
            conn.endheaders(body or None)
        except TimeoutError as exc:
            conn.close()
            raise _mapped(exc, request, httpx.WriteTimeout, httpx.WriteError) from exc
        except OSError as exc:
            # A server may answer before it has read the whole body (413, 401) and close:
            # read that answer, as httpcore does, and fail with the write error only if none.
            write_error = exc
        except BaseException:
            conn.close()
            raise
        try:
            conn.sock.settimeout(timeouts.get("read"))
            response = conn.getresponse()
            content = response.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            if write_error is not None:
                raise _mapped(write_error, request, httpx.WriteTimeout,
                              httpx.WriteError) from write_error
            raise _mapped(exc, request, httpx.ReadTimeout, httpx.ReadError) from exc
        except BaseException:
            conn.close()
            raise
        if response.will_close or write_error is not None:
            conn.close()
        else:
            self._checkin(origin, conn)
        return httpx.Response(
            response.status,
            headers=response.getheaders(),
            stream=httpx.ByteStream(content),
            extensions={"http_version": b"HTTP/1.1",
                        "reason_phrase": response.reason.encode("ascii", "replace")},
        )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle = [conn for conns in self._idle.values() for conn in conns]
            self._idle.clear()
        for conn in idle:
            conn.close()

    # -- connections ---------------------------------------------------------------------

    def _checkout(
        self, origin: tuple[str, int], request: httpx.Request, connect_timeout: float | None
    ) -> Any:
        while True:
            with self._lock:
                conns = self._idle.get(origin)
                conn = conns.pop() if conns else None
            if conn is None:
                break
            if conn.sock is not None and not _readable(conn.sock):
                return conn
            conn.close()  # the server closed it (or sent something unasked): never reuse
        conn = http.client.HTTPConnection(origin[0], origin[1], timeout=connect_timeout)
        try:
            conn.connect()
        except OSError as exc:
            conn.close()
            raise _mapped(exc, request, httpx.ConnectTimeout, httpx.ConnectError) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _checkin(self, origin: tuple[str, int], conn: http.client.HTTPConnection) -> None:
        with self._lock:
            conns = self._idle.setdefault(origin, [])
            if not self._closed and len(conns) < self.max_idle:
                conns.append(conn)
                return
        conn.close()


def _readable(sock: Any) -> bool:
    """Whether an idle connection's socket has something to read: EOF or stray bytes, so it
    must not carry the next request."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _mapped(
    exc: OSError | http.client.HTTPException,
    request: httpx.Request,
    timeout: type[httpx.TimeoutException],
    error: type[httpx.TransportError],
) -> httpx.TransportError:
    """The httpx exception for a failure of this phase (connect, write or read), so that the
    client's retries treat this transport exactly as httpx's own."""
    if isinstance(exc, TimeoutError):
        return timeout(str(exc) or "timed out", request=request)
    if isinstance(exc, http.client.RemoteDisconnected):  # also a ConnectionResetError
        return httpx.RemoteProtocolError(
            "Server disconnected without sending a response.", request=request
        )
    if isinstance(exc, http.client.HTTPException):
        return httpx.RemoteProtocolError(f"{type(exc).__name__}: {exc}", request=request)
    return error(f"{type(exc).__name__}: {exc}", request=request)
