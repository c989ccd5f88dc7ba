"""Write a recipe's pool as OUT/<label>/<seed>.png.

The layout ``tf.keras.utils.image_dataset_from_directory`` reads. The work is
:func:`genaug.service.commands.pool.run_export`.
"""

from __future__ import annotations

import argparse

from . import library
from .pool import pool_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--pool", default=None, help="pool id, when the file holds several")
    pool_arguments(parser)


def run(args: argparse.Namespace) -> int:
    pool = library("genaug.service.commands.pool", "export", "service")
    code: int = pool.run_export(args)
    return code
