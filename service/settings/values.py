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

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
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


# -- GENAUG_WEBHOOK_SECRET ------------------------------------------------------------------

#: A shorter webhook secret could be guessed offline from one signed body.
MIN_SECRET_CHARS = 16


def check_turbo(lora: Path | None, kind: str | None) -> None:
    """``GENAUG_TURBO_LORA`` and ``GENAUG_TURBO_KIND`` go together (the file's keys do not say
    which distillation it is)."""
    if lora is not None and kind is None:
        raise ValueError(
            f"GENAUG_TURBO_LORA={lora} needs GENAUG_TURBO_KIND: lcm, lightning, hyper-sd or "
            "tcd (the file's keys do not say which distillation it is)")
    if kind is not None and lora is None:
        raise ValueError(
            f"GENAUG_TURBO_KIND={kind} names the kind of GENAUG_TURBO_LORA, which is unset; "
            "set it to the LoRA file, or unset GENAUG_TURBO_KIND")
