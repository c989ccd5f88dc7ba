"""The sync client's ``http.client`` transport, over real loopback sockets: what it mounts
for, keep-alive reuse, never reusing a connection the server closed, and the httpx exceptions
each failure becomes (the client's retries act on those)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from genaug.client import Client
from genaug.client._transport import StdlibTransport, _readable, mounts
from genaug.local_service import free_port

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


@pytest.fixture
def raw_server() -> Iterator[Callable[[Callable[[socket.socket], None]], str]]:
    """A loopback TCP server whose every accepted connection runs ``handle(conn)`` in a
    thread; yields a function that starts one and returns its ``http://`` URL."""
    listeners: list[socket.socket] = []

    def start(handle: Callable[[socket.socket], None]) -> str:
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)

        def serve() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return  # closed at the end of the test
                threading.Thread(target=handle, args=(conn,), daemon=True).start()

        threading.Thread(target=serve, daemon=True).start()
        return f"http://127.0.0.1:{listener.getsockname()[1]}"

    yield start
    for listener in listeners:
        listener.close()


def _read_request(conn: socket.socket, *, body: bool = True) -> bytes:
    """The request's head, and its body (by Content-Length) unless ``body=False``. A server
    that closes with unread bytes makes the kernel reset the connection instead of ending it,
    so a test of a clean hang-up must read everything first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while body and len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        rest += chunk
    return data


def test_the_sync_client_mounts_it_for_plain_http_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    with Client("http://127.0.0.1:1") as client:
        http: Any = client._http
        assert isinstance(http._transport_for_url(httpx.URL("http://h:1/")), StdlibTransport)
        assert not isinstance(http._transport_for_url(httpx.URL("https://h/")), StdlibTransport)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    assert mounts() == {}  # a configured proxy: httpx routes plain HTTP through it, as always


def test_a_live_service_over_one_kept_alive_connection(service: Any) -> None:
    with Client(service.url, timeout=30) as client:
        transport = client._http._transport_for_url(httpx.URL(service.url))
        assert isinstance(transport, StdlibTransport)
        first = client.generate("a wound", n=2, seed=3)
        (conn,) = [c for conns in transport._idle.values() for c in conns]
        second = client.generate("a wound", n=2, seed=3)
        assert [c for conns in transport._idle.values() for c in conns] == [conn]  # reused
        np.testing.assert_array_equal(first.images, second.images)
        assert client.info()["version"]


def test_a_connection_the_server_closed_is_never_reused(
    raw_server: Callable[[Callable[[socket.socket], None]], str],
) -> None:
    accepted: list[socket.socket] = []

    def answer_once_then_close(conn: socket.socket) -> None:
        accepted.append(conn)
        _read_request(conn)
        conn.sendall(RESPONSE)  # no "Connection: close": the client keeps it alive
        conn.close()

    url = raw_server(answer_once_then_close)
    with httpx.Client(transport=StdlibTransport()) as http:
        assert http.get(url).text == "ok"
        transport: Any = http._transport
        (stale,) = [c for conns in transport._idle.values() for c in conns]
        deadline = time.monotonic() + 10
        while not _readable(stale.sock):  # the server's FIN has arrived
            assert time.monotonic() < deadline, "the closed connection never became readable"
            time.sleep(0.001)
        assert http.get(url).text == "ok"  # on a new connection, not an error
        assert len(accepted) == 2 and stale.sock is None  # the stale one was closed


def test_failures_become_the_httpx_errors_the_retries_expect(
    raw_server: Callable[[Callable[[socket.socket], None]], str],
) -> None:
    held: list[socket.socket] = []

    def hang_up(conn: socket.socket) -> None:
        _read_request(conn)
        conn.close()

    def never_answer(conn: socket.socket) -> None:
        held.append(conn)  # kept open, silent

    def garbage(conn: socket.socket) -> None:
        _read_request(conn)
        conn.sendall(b"SPAM\r\n\r\n")
        conn.close()

    with httpx.Client(transport=StdlibTransport(), timeout=0.3) as http:
        with pytest.raises(httpx.ConnectError):
            http.get(f"http://127.0.0.1:{free_port()}/")
        with pytest.raises(httpx.RemoteProtocolError, match="disconnected"):
            http.post(raw_server(hang_up), json={"n": 1})
        with pytest.raises(httpx.ReadTimeout):
            http.get(raw_server(never_answer))
        with pytest.raises(httpx.RemoteProtocolError, match="BadStatusLine"):
            http.get(raw_server(garbage))
        with pytest.raises(httpx.UnsupportedProtocol):
            http._transport.handle_request(httpx.Request("GET", "https://127.0.0.1/"))
    for conn in held:
        conn.close()


def test_an_answer_before_the_whole_body_is_read_is_returned(
    raw_server: Callable[[Callable[[socket.socket], None]], str],
) -> None:
    """A server that refuses a large body after its headers and closes (a proxy's 413):
    the client gets the 413, not the write error its unsent body ran into."""

    def refuse(conn: socket.socket) -> None:
        _read_request(conn, body=False)
        conn.sendall(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 8\r\n"
                     b"Connection: close\r\n\r\ntoo big!")
        conn.close()  # unread body: the kernel resets the connection

    with httpx.Client(transport=StdlibTransport(), timeout=10) as http:
        response = http.post(raw_server(refuse), content=b"x" * (64 << 20))
    assert (response.status_code, response.text) == (413, "too big!")


def test_one_transport_serves_threads_at_once(service: Any) -> None:
    """Each request has its own connection while it runs; all go back to the idle list."""
    transport = StdlibTransport()
    errors: list[BaseException] = []

    def fetch() -> None:
        try:
            response = transport.handle_request(
                httpx.Request("GET", service.url + "/healthz",
                              extensions={"timeout": {"connect": 5, "read": 5, "write": 5}})
            )
            response.read()
            assert response.status_code == 200
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=fetch) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    idle = [c for conns in transport._idle.values() for c in conns]
    assert 1 <= len(idle) <= 8
    transport.close()
    assert transport._idle == {} and all(c.sock is None for c in idle)
