"""What a service URL is: the one check the command line and the clients' users share.

A URL that is no service URL (``notaurl``, ``ftp://x``, ``http://``, a port out of range) is
refused at once, in one line naming the value and the form expected, instead of being sent
and answered as "no genaug service answers" after the retries. ``--url`` flags check it as
they are parsed (:func:`genaug.flags.service_url`); a command that falls back on
``GENAUG_URL`` checks that with :func:`env_url_refusal`; the clients' constructors (and the
feeder's, and ``genaug.torch``'s ``PoolDataset``, which build their clients later, in a
thread) check what they were given, or ``GENAUG_URL`` in its place, with :func:`url_refusal`.
Imports nothing of genaug (the base: every package may use it).

Example::

    url_problem("http://127.0.0.1:8000")   # None
    url_problem("notaurl")   # "'notaurl' is not a service URL (no http:// or https://); ..."
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from urllib.parse import urlsplit

__all__ = ["env_url_refusal", "url_problem", "url_refusal"]

_EXAMPLE = "write http://HOST:PORT, e.g. http://127.0.0.1:8000"


def url_problem(text: str) -> str | None:
    """Why ``text`` is not the URL of a service (``http(s)://HOST[:PORT][/PATH]``), or None."""
    try:
        parts = urlsplit(text.strip())
        _ = parts.port  # a port that is no number, or out of range, raises here
    except ValueError as exc:
        return f"{text!r} is not a URL ({exc}); {_EXAMPLE}"
    if parts.scheme not in ("http", "https"):
        said = f"scheme {parts.scheme!r}" if parts.scheme else "no http:// or https://"
        return f"{text!r} is not a service URL ({said}); {_EXAMPLE}"
    if not parts.hostname:
        return f"{text!r} names no host; {_EXAMPLE}"
    return None


def env_url_refusal(*, instead: str = "--url URL") -> str | None:
    """Why ``GENAUG_URL`` (comma-separated URLs), which a command without ``--url`` (or a
    client without ``url=``) falls back on, holds an entry that is not a service URL, ending
    with ``or pass {instead}``; None when it is unset or every entry is one."""
    for entry in (e.strip() for e in os.environ.get("GENAUG_URL", "").split(",")):
        problem = url_problem(entry) if entry else None
        if problem is not None:
            return f"GENAUG_URL entry {problem}, or pass {instead}"
    return None


def url_refusal(url: str | Sequence[str] | None, *, owner: str) -> str | None:
    """Why ``url`` given to ``owner`` (``"Client"``, ``"ReservoirFeeder"``) cannot be used: one
    URL, a list of replica URLs, or None for ``GENAUG_URL``'s; one line naming the argument
    (``url``, ``url[1]``, the variable), the value and the fix. None when every URL is one.

    Example::

        url_refusal(["http://a:8000", "b"], owner="AsyncClient")
        # "AsyncClient url[1] 'b' is not a service URL (no http:// or https://); write ..."
    """
    if url is None:
        refusal = env_url_refusal(instead="url=...")
        return None if refusal is None else f"{owner}: {refusal}"
    if isinstance(url, str):
        problem = url_problem(url)
        return None if problem is None else f"{owner} url {problem}"
    entries = list(url)
    if not entries:
        return (f"{owner} url is an empty list; give at least one service URL, e.g. "
                "http://127.0.0.1:8000")
    for i, entry in enumerate(entries):
        problem = (url_problem(entry) if isinstance(entry, str) else
                   f"{entry!r} is not a string; {_EXAMPLE}")
        if problem is not None:
            return f"{owner} url[{i}] {problem}"
    return None
