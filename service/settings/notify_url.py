"""The ``notify_url`` rule, written once: which receivers an operator allowed, whether a URL may
be called, and the served schema's pattern of the same.

- :func:`allowed_hosts` parses ``GENAUG_WEBHOOK_HOSTS`` (the settings call it at start-up).
- :func:`check_notify_url` decides one URL: the normalised URL, or :class:`RefusedUrl` with one
  line naming the value, the rule it broke and the fix (the allowed hosts, or the setting that
  turns webhooks on). The fill's request model runs it, once per request, as the field's own
  validator, so a refusal reads the same whoever sends it.
- :func:`notify_url_pattern` is the same rule as a JSON Schema ``pattern`` (case-insensitive
  scheme and host, a trailing dot, the scheme's default port written out): what generated
  clients and fuzzers see. Every URL it admits passes the check (a property test); the check
  also admits the few spellings a pattern cannot follow (an IPv6 literal written another way).

Nothing here imports the pipeline, the pool or the HTTP edge: the settings, the intake and the
sender all stand on it.

Example::

    hosts = allowed_hosts("hooks.example.com, 10.0.0.7:8080")
    check_notify_url("HTTPS://Hooks.Example.com./job", hosts)  # 'https://hooks.example.com/job'
    check_notify_url("https://evil.example/", hosts)           # RefusedUrl: ... not in ...
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from urllib.parse import urlsplit, urlunsplit

#: The setting that lists the hosts webhooks may go to.
HOSTS_SETTING = "GENAUG_WEBHOOK_HOSTS"
#: The setting that signs them (required with hosts).
SECRET_SETTING = "GENAUG_WEBHOOK_SECRET"
#: Longer URLs are refused: nothing legitimate needs more, and the URL is logged.
MAX_URL_CHARS = 2048
DEFAULT_PORTS = {"http": 80, "https": 443}
EXAMPLE_HOSTS = "hooks.example.com,10.0.0.7:8080"

# A host name as operators write them: DNS labels, and "_" for container service names.
_HOST_NAME = re.compile(r"^[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*$")
#: A TCP port, 1 to 65535, as a regular expression.
_PORT = r"(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
#: What a URL's path and query may hold in the pattern: RFC 3986's unreserved and sub-delims,
#: ':', '@', '%' and '/' (no spaces, controls, fragments or non-ASCII).
_URL_CHARS = r"[A-Za-z0-9\-._~!$&'()*+,;=:@%/]"


class RefusedUrl(ValueError):
    """A ``notify_url`` the service will not call; the message is the whole answer (value,
    rule, fix)."""


# -- the allowlist ---------------------------------------------------------------------------


def allowed_hosts(value: str) -> tuple[str, ...]:
    """Parse ``GENAUG_WEBHOOK_HOSTS``: comma-separated ``host`` or ``host:port`` entries.

    A bare ``host`` allows any port on that host (the operator trusts a machine; pin a port
    with ``host:port`` where other ports on it must stay out of reach). Host names match
    without regard to case or a trailing dot; IP literals are written plain
    (``10.0.0.7``) or in brackets (``[fd00::1]``, ``[fd00::1]:8080``; a bare ``fd00::1``
    can carry no port). There are no wildcards: each receiver is named. Returns the entries
    normalised (lower case, IPv6 bracketed and compressed), without duplicates, in order; an
    empty tuple for an empty value (webhooks off). Raises ``ValueError`` naming the entry::

        allowed_hosts("Hooks.Example.com, [FD00::1]:8080")
        # ('hooks.example.com', '[fd00::1]:8080')
    """
    out: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if not entry:
            continue
        host, port = _split_entry(entry)
        normal = _display(host) if port is None else f"{_display(host)}:{port}"
        if normal not in out:
            out.append(normal)
    return tuple(out)


def _split_entry(entry: str) -> tuple[str, int | None]:
    """``(host key, port or None)`` of one allowlist entry; ``ValueError`` naming it."""
    bad = ValueError(
        f"{HOSTS_SETTING} entry {entry!r} is not a host or host:port (examples: "
        f"hooks.example.com, hooks.example.com:8443, 10.0.0.7, [fd00::1]:8080); list host "
        f"names separated by commas, not URLs"
    )
    port_text: str | None = None
    if entry.startswith("["):
        host, bracket, rest = entry[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise bad
        port_text = rest[1:] if rest else None
    elif entry.count(":") >= 2:  # an IPv6 literal without brackets has no room for a port
        host = entry
    else:
        host, colon, after = entry.partition(":")
        port_text = after if colon else None
    key = _host_key(host)
    if not key or (not _is_ip(key) and not _HOST_NAME.match(key)):
        raise bad
    if entry.startswith("[") and ":" not in key:
        raise bad  # brackets hold IPv6 literals only
    if port_text is None:
        return key, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise bad
    return key, int(port_text)


def _host_key(host: str) -> str:
    """A host as it is compared: lower case, no trailing dot, IP literals in one spelling."""
    key = host.strip().lower().rstrip(".")
    try:
        return str(ipaddress.ip_address(key))
    except ValueError:
        return key


def _is_ip(key: str) -> bool:
    try:
        ipaddress.ip_address(key)
    except ValueError:
        return False
    return True


def _display(key: str) -> str:
    """A host key as it is written before a port: IPv6 in brackets."""
    return f"[{key}]" if ":" in key else key


# -- one URL -----------------------------------------------------------------------------------


def check_notify_url(url: str, hosts: Sequence[str]) -> str:
    """``url`` if the service may POST to it, normalised; otherwise :class:`RefusedUrl`.

    Refused, each with one line naming the field, the value, the rule and the fix: a URL over
    :data:`MAX_URL_CHARS` characters or with whitespace or control characters; a scheme other
    than ``http``/``https``; no host; credentials (``user:password@``: they would travel to,
    and be logged by, every hop, and the signature already authenticates the service); a
    fragment (``#...``: HTTP never sends it, so a URL carrying one is a mistake); a host (with
    its port, or the scheme's default) that ``hosts`` does not allow, naming the allowed ones.
    With ``hosts`` empty, whatever the URL, the message says webhooks are off and which
    setting turns them on.

    ``hosts`` is :func:`allowed_hosts`' result (re-normalised here, so hand-written lists
    work too). The host is matched by name, without a DNS lookup: an answer now says nothing
    of the address the delivery will reach later (DNS can change), and the operator who lists
    a name trusts whatever it points to. The delivery re-checks nothing more.

    The normalised URL has a lower-case scheme and host, no trailing dot, no default port,
    and ``/`` for an empty path::

        check_notify_url("HTTPS://Hooks.Example.com:443", ["hooks.example.com"])
        # 'https://hooks.example.com/'
    """
    shown = _shown(url)
    try:
        allowed = allowed_hosts(",".join(hosts))
    except ValueError as exc:  # the operator's list, not the client's URL: say so
        raise RefusedUrl(f"notify_url {shown} cannot be checked: {exc}") from None
    if not allowed:
        raise RefusedUrl(
            f"notify_url {shown}: webhooks are off on this service ({HOSTS_SETTING} is empty, "
            f"the default); leave notify_url out, or ask the operator to turn webhooks on by "
            f"listing the receiver's host in {HOSTS_SETTING} (e.g. "
            f"{HOSTS_SETTING}={EXAMPLE_HOSTS}, with {SECRET_SETTING})")
    where = f"an http(s) URL to one of {', '.join(allowed)} (the hosts in {HOSTS_SETTING})"
    if len(url) > MAX_URL_CHARS:
        raise RefusedUrl(f"notify_url {shown} is {len(url)} characters, over the limit of "
                         f"{MAX_URL_CHARS}; send a shorter URL")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise RefusedUrl(f"notify_url {shown} contains whitespace or control characters; "
                         "percent-encode them (%20)")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # a port that is no number, an unclosed IPv6 bracket
        raise RefusedUrl(f"notify_url {shown} is not a valid URL ({exc}); send {where}") \
            from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise RefusedUrl(f"notify_url {shown}: scheme {parts.scheme or '(none)'!r} is not http "
                         f"or https; send {where}")
    if "@" in parts.netloc:
        raise RefusedUrl(f"notify_url {shown} carries credentials (user:password@); drop "
                         "them: the X-Genaug-Signature header authenticates the service to "
                         "the receiver")
    if "#" in url:
        raise RefusedUrl(f"notify_url {shown} has a fragment (#...), which HTTP never sends "
                         "to the receiver; drop it, or move it into the query (?...)")
    if not parts.hostname:
        raise RefusedUrl(f"notify_url {shown} has no host; send {where}")
    host = _display(_host_key(parts.hostname))
    effective = port if port is not None else DEFAULT_PORTS[scheme]
    if host not in allowed and f"{host}:{effective}" not in allowed:
        raise RefusedUrl(
            f"notify_url {shown}: host {host}:{effective} is not in {HOSTS_SETTING} "
            f"({', '.join(allowed)}); send to one of those, or ask the operator to add "
            f"{host} to {HOSTS_SETTING}")
    netloc = host if port is None or port == DEFAULT_PORTS[scheme] else f"{host}:{port}"
    return urlunsplit((scheme, netloc, parts.path or "/", parts.query, ""))


def _shown(url: str, limit: int = 200) -> str:
    """The client's value as a message shows it: quoted, escaped, cut at ``limit``."""
    return repr(url if len(url) <= limit else url[:limit] + "...")


def fix_text(hosts: Sequence[str]) -> str:
    """What a 422 on a ``notify_url`` of the wrong type says to do, for these hosts."""
    if not hosts:
        return (f"leave notify_url out: webhooks are off on this service ({HOSTS_SETTING} is "
                f"empty); an operator turns them on by listing receivers in {HOSTS_SETTING}")
    return (f"send an http(s) URL of at most {MAX_URL_CHARS} characters to a host in "
            f"{HOSTS_SETTING} ({', '.join(hosts)}), or leave notify_url out")


# -- the served schema's pattern ---------------------------------------------------------------


def notify_url_pattern(hosts: Sequence[str]) -> str:
    """The ``notify_url`` a fill may send, as a JSON Schema ``pattern`` (ECMA-262, no flags):
    http(s) in any case to a host of ``hosts`` in any case, with or without a trailing dot
    (any port for a bare host; for ``host:port`` that port, written or, when it is the
    scheme's default, left out), with a plain path and query. Every URL it matches passes
    :func:`check_notify_url`."""
    http, https = _any_case("http"), _any_case("https")
    alternatives = []
    for entry in allowed_hosts(",".join(hosts)):
        host, port = _split_entry(entry)
        name = _any_case(re.escape(_display(host))) + ("" if _is_ip(host) else r"\.?")
        if port is None:
            alternatives.append(f"{_any_case('http')}[Ss]?://{name}(?::{_PORT})?")
            continue
        alternatives.append(f"{_any_case('http')}[Ss]?://{name}:{port}")
        if port == DEFAULT_PORTS["http"]:
            alternatives.append(f"{http}://{name}")
        if port == DEFAULT_PORTS["https"]:
            alternatives.append(f"{https}://{name}")
    return (rf"^(?:{'|'.join(alternatives)})(?:/{_URL_CHARS}*)?"
            rf"(?:\?{_URL_CHARS.replace('/]', '/?]')}*)?$")


def _any_case(text: str) -> str:
    """``text`` as a pattern that matches it in any case (JSON Schema patterns take no
    flags): each letter as ``[xX]``."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in text)
