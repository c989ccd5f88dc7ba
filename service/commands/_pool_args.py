"""What ``pregenerate``, ``export`` and ``pool`` share: which pool, and opening it.

:func:`pool_location` adds ``--pool-path`` / ``--pool-url`` (which pool database, default the
settings'), :func:`pool_arguments` adds ``--recipe`` and ``--recipes`` to them;
:func:`pool_settings` and :func:`open_store` read them back. Nothing heavy at import: settings
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


def pool_settings(args: argparse.Namespace) -> Settings:
    """Settings from the environment, with the command's pool flags over them."""
    from ..settings import Settings

    overrides: dict[str, Any] = {}
    if getattr(args, "pool_path", None) is not None:
        overrides["pool_path"] = args.pool_path
    if getattr(args, "pool_url", None) is not None:
        overrides["pool_url"] = args.pool_url
    return Settings(**overrides)


def open_store(args: argparse.Namespace, command: str,
               capacity: int | None = None) -> tuple[PoolStore | None, str]:
    """The pool the flags and settings name, or None and a one-line reason."""
    from ..pool.open import open_pool_store
    from ..pool.types import PoolError

    settings = pool_settings(args)
    if settings.pool_url is None and not Path(settings.pool_path).exists() and capacity is None:
        return None, (f"genaug {command}: no pool database at {settings.pool_path}; pass "
                      "--pool-path or --pool-url (or set GENAUG_POOL_PATH / GENAUG_POOL_URL)")
    try:
        return open_pool_store(settings, capacity_per_label=capacity), ""
    except PoolError as exc:
        return None, f"genaug {command}: {exc}"
