"""What ``pregenerate``, ``export`` and ``pool`` share: which pool, and opening it.

:func:`pool_location` adds ``--pool-path`` / ``--pool-url`` (which pool database, default the
settings'), :func:`pool_arguments` adds ``--recipe`` and ``--recipes`` to them;
:func:`pool_settings` (:func:`checked_settings`: or what is invalid, in one line per
setting) and :func:`open_store` read them back. Nothing heavy at import: settings
and the pool store are imported when a command runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..pool.store import PoolStore
    from ..settings import Settings


def pool_location(parser: argparse.ArgumentParser) -> None:
    """``--pool-path`` / ``--pool-url``: which pool database (default: the settings')."""
    parser.add_argument("--pool-path", type=Path, default=None,
                        help="SQLite pool file (default: GENAUG_POOL_PATH)")
    parser.add_argument("--pool-url", default=None,
                        help="PostgreSQL pool, postgresql://... (default: GENAUG_POOL_URL)")


def pool_arguments(parser: argparse.ArgumentParser) -> None:
    """``--recipe``, ``--recipes`` and the pool's location: which recipe's pool, where."""
    parser.add_argument("--recipe", required=True, help="recipe name")
    parser.add_argument("--recipes", type=Path, default=None,
                        help="recipe file (default: GENAUG_RECIPES)")
    pool_location(parser)


#: The pool flags, by the Settings field they set.
_FLAGS = {"pool_path": "--pool-path", "pool_url": "--pool-url"}


def pool_settings(args: argparse.Namespace) -> Settings:
    """Settings from the environment, with the command's pool flags over them; an invalid
    value raises pydantic's ``ValidationError`` (:func:`checked_settings` says it)."""
    from ..settings import Settings

    overrides: dict[str, Any] = {field: getattr(args, field) for field in _FLAGS
                                 if getattr(args, field, None) is not None}
    return Settings(**overrides)


def checked_settings(args: argparse.Namespace, command: str) -> tuple[Settings | None, str]:
    """:func:`pool_settings`, or None and what is invalid: one line per setting, naming its
    ``GENAUG_*`` variable or its flag, the value and what is allowed."""
    from pydantic import ValidationError

    from ..settings.errors import settings_refusal

    try:
        return pool_settings(args), ""
    except ValidationError as exc:
        given = {field: flag for field, flag in _FLAGS.items()
                 if getattr(args, field, None) is not None}
        return None, "\n".join(f"genaug {command}: {line}"
                               for line in settings_refusal(exc, flags=given))


def open_store(args: argparse.Namespace, command: str,
               capacity: int | None = None) -> tuple[PoolStore | None, str]:
    """The pool the flags and settings name, or None and a one-line reason (one per invalid
    setting)."""
    from ..pool.open import open_pool_store
    from ..pool.types import PoolError

    settings, problem = checked_settings(args, command)
    if settings is None:
        return None, problem
    if settings.pool_url is None and not Path(settings.pool_path).exists() and capacity is None:
        return None, (f"genaug {command}: no pool database at {settings.pool_path}; pass "
                      "--pool-path or --pool-url (or set GENAUG_POOL_PATH / GENAUG_POOL_URL)")
    try:
        return open_pool_store(settings, capacity_per_label=capacity), ""
    except PoolError as exc:
        return None, f"genaug {command}: {exc}"
