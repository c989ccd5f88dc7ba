"""The reference TensorFlow trainer.

Every flag is a :class:`~genaug.trainer.reference.config.TrainConfig` field; the run is
:func:`genaug.trainer.reference.command.run_train`. Exit status: 0 done, 2 bad data, devices,
labels or feeder configuration (nothing trained), 3 stopped on a non-finite loss, 4
``--doctor`` found a problem (nothing trained), 130 interrupted (Ctrl-C; nothing is saved).
"""

from __future__ import annotations

import argparse

from . import library


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config = library("genaug.trainer.reference.config", "train", "trainer")
    config.add_train_arguments(parser)


def run(args: argparse.Namespace) -> int:
    command = library("genaug.trainer.reference.command", "train", "trainer")
    code: int = command.run_train(args)
    return code


def interrupted(args: argparse.Namespace) -> str:
    return "nothing is saved (the reference trainer keeps no checkpoint); run it again"
