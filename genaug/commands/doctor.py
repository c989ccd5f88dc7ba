"""Check the service, the recipe's pool, GPUs, XLA, versions and memory before training.

Exit status 1 when a check failed, each failed check with its fix. The checks are
:mod:`genaug.doctor`'s.
"""

from __future__ import annotations

import argparse

from . import library


def add_arguments(parser: argparse.ArgumentParser) -> None:
    library("genaug.doctor", "doctor", "client").add_doctor_arguments(parser)


def run(args: argparse.Namespace) -> int:
    code: int = library("genaug.doctor", "doctor", "client").run_doctor(args)
    return code
