"""List the pools in the pool database, or drop one.

``genaug pool list`` shows the pool ids with their image counts; ``genaug pool drop POOL_ID``
deletes one pool's images and counters. The work is
:func:`genaug.service.commands.pool.run_pool`. :func:`pool_arguments` and
:func:`pool_location` are the flags ``pregenerate`` and ``export`` share with it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import library


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pool_sub = parser.add_subparsers(dest="pool_command", required=True)
    pool_list = pool_sub.add_parser("list", help="pool ids with their image counts")
    pool_location(pool_list)
    pool_drop = pool_sub.add_parser("drop", help="delete one pool's images and counters")
    pool_drop.add_argument("pool_id", help="exact pool id, as `genaug pool list` shows it")
    pool_location(pool_drop)


def run(args: argparse.Namespace) -> int:
    code: int = library("genaug.service.commands.pool", "pool", "service").run_pool(args)
    return code
