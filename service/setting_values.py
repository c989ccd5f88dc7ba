"""The composite values a setting is written as, parsed: one job, apart from the declaration.

:class:`~genaug.service.settings.Settings` declares each field (type, default, bound,
description: the flags of ``genaug serve`` are generated from them, in order); a field written
as one string in the environment that holds several values (``GENAUG_WARMUP_SHAPES``,
``GENAUG_LORAS``, ``GENAUG_API_KEYS``, ``GENAUG_CORS_ORIGINS``) is read here. Each parser
raises ``ValueError`` with one line naming the bad entry and the form expected; pydantic
reports it under the field's name. Nothing here imports the pipeline: the warm-up reads its
shapes from the settings.

Example::

    parse_warmup_shapes("1024x1024:8, 768x768:4")  # (WarmupShape(1024, 1024, 8), ...)
    parse_loras("ink=/loras/ink.safetensors")      # {"ink": "/loras/ink.safetensors"}
    split_commas("a, b,,c")                        # ["a", "b", "c"]
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

_LORA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_SHAPE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*:\s*(\d+)\s*$")


class WarmupShape(NamedTuple):
    """One ``HxW:batch`` entry of ``GENAUG_WARMUP_SHAPES``: generation size and batch size.

    Example::

        WarmupShape.parse("1024x1024:8")   # WarmupShape(height=1024, width=1024, batch=8)
        str(WarmupShape(768, 1024, 4))     # '768x1024:4'
    """

    height: int
    width: int
    batch: int

    def __str__(self) -> str:
        return f"{self.height}x{self.width}:{self.batch}"

    @classmethod
    def parse(cls, text: str) -> WarmupShape:
        match = _SHAPE.match(text)
        if match is None:
            raise ValueError(
                f"warm-up shape {text.strip()!r} is not HxW:batch; write e.g. 1024x1024:8 "
                "(several separated by commas)"
            )
        height, width, batch = (int(g) for g in match.groups())
        for name, value in (("height", height), ("width", width)):
            if value < 8 or value % 8:
                raise ValueError(
                    f"warm-up shape {text.strip()!r}: {name} {value} is not a positive "
                    "multiple of 8 (the VAE downsamples by 8); e.g. 1024x1024:8"
                )
        if batch < 1:
            raise ValueError(f"warm-up shape {text.strip()!r}: batch {batch} must be >= 1")
        return cls(height, width, batch)


def parse_warmup_shapes(value: object) -> tuple[WarmupShape, ...]:
    """``"1024x1024:8, 768x768:4"`` (or a list of such strings or shapes) -> shapes, in order,
    without duplicates. Raises ``ValueError`` naming the bad entry and the expected form."""
    if value is None:
        return ()
    if isinstance(value, str):
        parts: Iterable[Any] = [p for p in value.split(",") if p.strip()]
    elif isinstance(value, Iterable):
        parts = value
    else:
        raise ValueError(f"warm-up shapes must be a string like '1024x1024:8', got {value!r}")
    out: list[WarmupShape] = []
    for part in parts:
        if isinstance(part, str):
            shape = WarmupShape.parse(part)
        elif isinstance(part, Sequence) and len(part) == 3:
            shape = WarmupShape.parse(f"{part[0]}x{part[1]}:{part[2]}")
        else:
            raise ValueError(f"warm-up shape {part!r} is not HxW:batch; write e.g. 1024x1024:8")
        if shape not in out:
            out.append(shape)
    return tuple(out)


def parse_loras(value: object) -> object:
    """``GENAUG_LORAS``'s ``name=path[,name=path...]`` -> ``{name: path}``; anything but a
    string (a dict given in code) is left to the field's type."""
    if not isinstance(value, str):
        return value
    out: dict[str, str] = {}
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        name, sep, path = (x.strip() for x in part.partition("="))
        if not sep or not name or not path:
            raise ValueError(f"LoRA entry {part!r} is not name=path (GENAUG_LORAS)")
        if name in out:
            raise ValueError(f"LoRA name {name!r} appears twice (GENAUG_LORAS)")
        out[name] = path
    return out


def check_lora_names(names: Iterable[str]) -> None:
    """Refuse a ``GENAUG_LORAS`` name that is not 1 to 64 letters, digits, '_', '.' or '-'
    starting with a letter or digit."""
    for name in names:
        if not _LORA_NAME.fullmatch(name):
            raise ValueError(
                f"LoRA name {name!r} must be letters, digits, '_', '.' or '-' (at most 64, "
                "starting with a letter or digit)"
            )


def split_commas(value: object) -> object:
    """A comma-separated string -> its non-empty parts, stripped; a list is left as it is."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


# -- GENAUG_WEBHOOK_HOSTS ------------------------------------------------------------------

#: The setting that lists the hosts webhooks may go to.
HOSTS_SETTING = "GENAUG_WEBHOOK_HOSTS"
#: A shorter webhook secret could be guessed offline from one signed body.
MIN_SECRET_CHARS = 16

# A host name as operators write them: DNS labels, and "_" for container service names.
_HOST_NAME = re.compile(r"^[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*$")


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
