"""A URL that is no service URL is refused where the client is made, in one line, at once.

Sent, ``notaurl`` would be answered only after the retry deadline (30 s by default) as "no
answer from the genaug service"; the constructor says instead which argument holds what, and
how to write it. The same rule as ``--url`` flags (:func:`genaug.urls.url_problem`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from genaug.client import AsyncClient, Client

FIX = "write http://HOST:PORT, e.g. http://127.0.0.1:8000"


def refusal(make: Callable[[], Any]) -> str:
    """The one line ``make()`` is refused with, asserting that it came in under a second."""
    started = time.monotonic()
    with pytest.raises(ValueError) as refused:
        made = make()
        if isinstance(made, AsyncClient):  # not refused: close it, the assertion fails
            asyncio.run(made.aclose())
        elif isinstance(made, Client):
            made.close()
    assert time.monotonic() - started < 1.0
    message = str(refused.value)
    assert "\n" not in message, message
    return message


def test_client_refuses_a_malformed_url() -> None:
    assert refusal(lambda: Client("notaurl")) == (
        f"Client url 'notaurl' is not a service URL (no http:// or https://); {FIX}")


@pytest.mark.parametrize(("url", "said"), [
    ("ftp://gen-host", "scheme 'ftp'"), ("http://", "names no host"),
    ("http://gen-host:99999", "out of range"),
])
def test_client_names_what_is_wrong_with_the_url(url: str, said: str) -> None:
    message = refusal(lambda: Client(url, retry_deadline=30))
    assert message.startswith(f"Client url {url!r} ") and said in message and FIX in message


def test_async_client_names_the_replica_at_fault() -> None:
    assert refusal(lambda: AsyncClient(["http://127.0.0.1:1", "nota url"])) == (
        f"AsyncClient url[1] 'nota url' is not a service URL (no http:// or https://); {FIX}")


def test_an_empty_list_of_replicas_is_refused_naming_the_argument() -> None:
    assert refusal(lambda: Client([])).startswith("Client url is an empty list; give at least "
                                                  "one service URL, e.g. http://")


def test_a_malformed_genaug_url_is_refused_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENAUG_URL", "http://127.0.0.1:1,gen-host:8000")
    assert refusal(lambda: AsyncClient()) == (
        "AsyncClient: GENAUG_URL entry 'gen-host:8000' is not a service URL (scheme "
        f"'gen-host'); {FIX}, or pass url=...")


def test_a_well_formed_url_is_kept_without_the_spaces_around_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with Client(" http://127.0.0.1:9/ ") as client:
        assert client.urls == ["http://127.0.0.1:9"]
    monkeypatch.setenv("GENAUG_URL", " , ")  # no entry: the default, as the commands do
    with Client() as client:
        assert client.urls == ["http://127.0.0.1:8000"]
