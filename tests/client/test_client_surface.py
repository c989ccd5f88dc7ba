"""The client's public surface: its names, its light imports, and its error tree."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

import genaug.client
from genaug.client import errors

PUBLIC_NAMES = [
    "AsyncClient",
    "AsyncFillJob",
    "AuthenticationError",
    "Client",
    "ConflictError",
    "DeadlineExceededError",
    "DecodeError",
    "FillJob",
    "GenaugError",
    "GenerateResult",
    "InvalidRequestError",
    "NotFoundError",
    "RateLimitedError",
    "SampleResult",
    "ServerError",
    "StatusError",
    "TransportError",
    "UnavailableError",
    "backoff_s",
]

HEAVY = ["torch", "tensorflow", "diffusers", "transformers", "fastapi", "starlette", "uvicorn",
         "genaug.service", "genaug.trainer"]


def test_all_is_pinned_and_alphabetized() -> None:
    assert genaug.client.__all__ == PUBLIC_NAMES
    assert sorted(genaug.client.__all__) == genaug.client.__all__


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_every_public_name_resolves_to_a_documented_client_object(name: str) -> None:
    obj = getattr(genaug.client, name)
    assert obj.__module__.startswith("genaug.client."), obj.__module__
    assert obj.__doc__ and obj.__doc__.strip(), f"{name} has no docstring"


def test_no_other_public_names_leak() -> None:
    public = {n for n in vars(genaug.client) if not n.startswith("_")}
    # Submodules appear as attributes once imported; everything else must be in __all__.
    modules = {"errors", "annotations"}
    assert public - modules == set(PUBLIC_NAMES)


def test_importing_and_constructing_clients_stays_light() -> None:
    # genaug[client] installs without torch, tensorflow or fastapi: the client and the wire
    # codecs it shares with the service must import and work without them.
    code = f"""
import asyncio, json, sys
import genaug.client
import genaug.wire
from genaug.client import AsyncClient, Client, GenaugError
with Client("http://127.0.0.1:9", api_key="k", client_id="c", retry_deadline=1) as c:
    pass
async def main():
    async with AsyncClient(["http://127.0.0.1:9", "http://127.0.0.1:10"]) as c:
        pass
asyncio.run(main())
print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_the_probe_would_notice_a_heavy_import() -> None:
    # Guard against a probe that can't fail: the same check sees fastapi once it is imported.
    code = "import sys, genaug.client, fastapi; print('fastapi' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.stdout.strip() == "True", result.stderr


# -- the error tree --------------------------------------------------------------------------

EXPECTED_TREE = {
    "GenaugError": Exception,
    "TransportError": "GenaugError",
    "StatusError": "GenaugError",
    "DecodeError": "GenaugError",
    "InvalidRequestError": "StatusError",
    "ConflictError": "InvalidRequestError",
    "AuthenticationError": "StatusError",
    "NotFoundError": "StatusError",
    "RateLimitedError": "StatusError",
    "UnavailableError": "StatusError",
    "DeadlineExceededError": "StatusError",
    "ServerError": "StatusError",
}


def documented_tree() -> dict[str, tuple[str | None, str]]:
    """``{name: (parent, description)}`` drawn in the docstring of ``errors.py``."""
    assert errors.__doc__
    tree: dict[str, tuple[str | None, str]] = {}
    stack: list[tuple[int, str]] = []
    for line in errors.__doc__.splitlines():
        match = re.match(r"^(\s*(?:[│ ]\s*)*(?:[├└]──\s*)?)([A-Z]\w*Error)\b(.*)$", line)
        if not match:
            continue
        column = len(match.group(1))
        name = match.group(2)
        while stack and stack[-1][0] >= column:
            stack.pop()
        tree[name] = (stack[-1][1] if stack else None, match.group(3).strip())
        stack.append((column, name))
    return tree


def test_docstring_draws_the_expected_tree() -> None:
    tree = documented_tree()
    expected = {
        name: (None if parent is Exception else parent)
        for name, parent in EXPECTED_TREE.items()
    }
    assert {name: parent for name, (parent, _) in tree.items()} == expected


@pytest.mark.parametrize("name", sorted(EXPECTED_TREE))
def test_classes_match_the_drawn_tree(name: str) -> None:
    cls = getattr(genaug.client, name)
    parent = EXPECTED_TREE[name]
    parent_cls = parent if isinstance(parent, type) else getattr(genaug.client, parent)
    assert cls.__bases__ == (parent_cls,)
    assert issubclass(cls, Exception)
    if name != "GenaugError":
        assert issubclass(cls, genaug.client.GenaugError)


def test_every_error_class_is_public_and_drawn() -> None:
    defined = {
        name for name, obj in vars(errors).items()
        if isinstance(obj, type) and issubclass(obj, errors.GenaugError)
    }
    assert defined == set(EXPECTED_TREE) == set(documented_tree())
    assert defined <= set(PUBLIC_NAMES)


def test_documented_statuses_translate_to_their_classes() -> None:
    checked = 0
    for name, (_, description) in documented_tree().items():
        for group in re.findall(r"\b([45]\d\d(?:/[45]\d\d)*)\b", description):
            for status in group.split("/"):
                assert errors.error_class(int(status)) is getattr(errors, name), (status, name)
                checked += 1
    assert checked >= 9
    for status in (500, 502, 599):
        assert errors.error_class(status) is errors.ServerError
    assert errors.error_class(403) is errors.AuthenticationError


def test_status_errors_carry_their_fields() -> None:
    error = errors.RateLimitedError("queue full", status=429, error_type="queue_full",
                                    field=None, error_id="abc", retry_after=2.0, url="http://x")
    assert (error.status, error.error_type, error.error_id, error.retry_after, error.url) == (
        429, "queue_full", "abc", 2.0, "http://x")
    assert str(error) == "queue full"
    invalid = errors.InvalidRequestError("bad n", status=422, field="n")
    assert invalid.field == "n" and invalid.retry_after is None
