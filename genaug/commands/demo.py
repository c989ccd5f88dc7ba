"""The full loop on the tiny model: service, grid, pool, training, stop.

The whole round trip on the embedded default, no GPU, no download. Starts ``genaug serve``
(the ``tiny-digits`` generator) as a child process on 127.0.0.1, waits for readiness, asks the
client for a column of images per digit and writes them as one labelled grid PNG, then (unless
``--no-train``) trains a small CNN on 5 real digits per class in a separate TensorFlow
process, with and without pool images mixed in through the reservoir, prints both test
accuracies, and stops everything; the orchestration is
:func:`genaug.experiments.demo.run_full_demo`. With ``--no-train`` it waits for the recipe pool to
fill instead. Ctrl-C stops the service and the training process, then ends in one line
(exit status 130).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="genaug-demo.png", help="where to write the grid PNG")
    parser.add_argument("--port", type=int, default=0, help="port (0: a free one)")
    parser.add_argument("--no-train", action="store_true",
                        help="stop after the grid and the pool (no TensorFlow needed)")


def run(args: argparse.Namespace) -> int:
    from genaug.experiments.demo import run_full_demo

    code: int = run_full_demo(port=args.port, grid_out=Path(args.out), train=not args.no_train)
    return code


def interrupted(args: argparse.Namespace) -> str:
    from genaug.experiments.demo import interrupted_note

    return interrupted_note(Path(args.out))
