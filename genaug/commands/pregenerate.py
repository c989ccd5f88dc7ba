"""Fill a recipe's pool, with progress bars.

``--per-label N`` fills every label to ``N`` images (resumable; Ctrl-C keeps every finished
batch); ``--images B --url URL`` spends ``B`` more images by the trainers' need. Without
``--url`` it generates in this process. The work is
:func:`genaug.service.commands.pool.run_pregenerate`.
"""

from __future__ import annotations

import argparse

from . import library
from .pool import pool_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
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
