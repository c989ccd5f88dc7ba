"""Fill a recipe's pool, with progress bars.

``--per-label N`` fills every label to ``N`` images (resumable; Ctrl-C keeps every finished
batch); ``--images B --url URL`` spends ``B`` more images by the trainers' need. Without
``--url`` it generates in this process. The work is
:func:`genaug.service.commands.pool.run_pregenerate`.

A label the recipe's judge stopped (under 10 % of its images accepted) gets no more images:
the command fills every other label, then ends with exit status 3, naming each stopped label
with the judge's reason and fix, instead of waiting for ever. Exit statuses: 0 filled, 1 the
service refused or failed, 2 bad arguments, recipe file or pool, 3 a label the judge stopped,
130 Ctrl-C (also in ``--help``).
"""

from __future__ import annotations

import argparse

from . import library
from .pool import pool_arguments

#: The exit statuses, for ``--help``; 3 is the library's ``STOPPED_EXIT``.
EXIT_STATUSES = (
    "exit status: 0 every label filled; 1 the service refused or failed; 2 bad arguments, "
    "recipe file or pool; 3 the judge stopped a label (under 10 % of its images accepted: "
    "no more are made), every other label is filled and the stopped ones are named with "
    "the judge's reason and fix; 130 Ctrl-C (every finished batch is kept)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXIT_STATUSES
    amount = parser.add_mutually_exclusive_group(required=True)
    amount.add_argument("--per-label", type=int, help="fill every label to this many images")
    amount.add_argument("--images", type=int,
                        help="this many more images, split over the labels by the trainers' "
                             "need and recent demand (needs --url)")
    parser.add_argument("--url", default=None,
                        help="a running service to fill (default: generate in this process)")
    pool_arguments(parser)


def run(args: argparse.Namespace) -> int:
    pool = library("genaug.service.commands.pool", "pregenerate", "service")
    code: int = pool.run_pregenerate(args)
    return code


def interrupted(args: argparse.Namespace) -> str:
    if args.url:
        return ("a fill the service accepted goes on there; run the same command again to "
                "watch it")
    return "every batch stored before the interrupt is kept; run the same command again to resume"
