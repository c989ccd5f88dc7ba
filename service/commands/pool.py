"""List the pools in the pool database, or drop one.

``genaug pool list`` shows the pool ids with their image counts; ``genaug pool drop POOL_ID``
deletes one pool (one of an old spec or model, or one whose images differ in shape): its images
and every row recorded for it (counters, stops, its recipe's spec, ``auto``'s decision and
tallies), so the pool filled again starts afresh.
"""

from __future__ import annotations

import argparse
import sys

from ..jobs.queries import JobQueries
from ._pool_args import open_store, pool_location


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pool_sub = parser.add_subparsers(dest="pool_command", required=True)
    pool_list = pool_sub.add_parser("list", help="pool ids with their image counts")
    pool_location(pool_list)
    pool_drop = pool_sub.add_parser(
        "drop", help="delete one pool: its images and all recorded for it (auto's decision too)")
    pool_drop.add_argument("pool_id", help="exact pool id, as `genaug pool list` shows it")
    pool_location(pool_drop)


def run(args: argparse.Namespace) -> int:
    """``genaug pool list`` and ``genaug pool drop POOL_ID``."""
    store, problem = open_store(args, f"pool {args.pool_command}")
    if store is None:
        print(problem, file=sys.stderr)
        return 2
    try:
        pools = store.reads.pools()
        if args.pool_command == "list":
            for pid in pools:
                stats = store.stats(pid)
                fill = {label: s.fill for label, s in stats.items()}
                print(f"{pid}  {sum(fill.values())} images  {fill}")
            if not pools:
                print(f"no pools in {store.location}")
            return 0
        if args.pool_id not in pools:
            print(f"genaug pool drop: no pool {args.pool_id!r} in {store.location}; "
                  f"it has: {', '.join(pools) or 'none'} (exact ids, see `genaug pool list`)",
                  file=sys.stderr)
            return 1
        # its live fill jobs fail in the same transaction
        gone = store.drop_pool(args.pool_id, also=JobQueries(store).fail_live)
        print(f"dropped pool {args.pool_id}: {gone} images deleted")
        return 0
    finally:
        store.close()
