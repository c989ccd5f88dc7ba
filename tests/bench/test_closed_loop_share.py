"""bench.service.closed_loop_share's clients: a failed request is counted and asked again.

A costly batch shared half and half can take longer than the service's default deadline on
a busy 2-core machine; a 504 that ended that client's closed loop (the thread raising)
would leave the client fewer requests in flight for the rest of the window and misread its
share. Here a stand-in service on 127.0.0.1 answers the first request 504 and the rest 200.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from bench.service import closed_loop_share
from bench.service.closed_loop_share import IN_FLIGHT, _closed_loop


class _Service(BaseHTTPRequestHandler):
    bodies: list[dict[str, Any]] = []  # the JSON bodies received
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            self.bodies.append(body)
            first = len(self.bodies) == 1
        status = 504 if first else 200
        payload = b'{"detail": "deadline"}' if first else b"images"
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


@pytest.fixture
def url() -> Iterator[str]:
    _Service.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Service)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_failed_request_is_counted_and_the_client_keeps_asking(url: str) -> None:
    stop = threading.Event()
    done: list[float] = []
    failed: list[str] = []
    loop = threading.Thread(target=_closed_loop,
                            args=(url, "costly", {"height": 64, "width": 64, "steps": 2},
                                  stop, done, failed))
    loop.start()
    try:
        for _ in range(500):
            if len(done) >= 6:
                break
            stop.wait(0.01)
    finally:
        stop.set()
        loop.join(timeout=10)
    assert not loop.is_alive()
    assert len(failed) == 1 and failed[0].startswith("504")
    assert len(done) >= 6  # both threads went on asking after the 504
    assert len({body["seed"] for body in _Service.bodies}) == len(_Service.bodies)
    assert all(body.get("timeout_s", 120) > 120 for body in _Service.bodies)
    assert IN_FLIGHT == 2


def test_repeat_must_be_at_least_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        closed_loop_share.run(["--repeat", "0"])
    assert "--repeat 0 is below 1" in capsys.readouterr().err
