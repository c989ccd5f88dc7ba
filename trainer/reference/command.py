"""The reference TensorFlow trainer.

``genaug train``: parsed flags in, a summary printed and an exit status out. Every flag is a
:class:`~genaug.trainer.reference.config.TrainConfig` field (:func:`add_arguments` derives
them from it); the trainer itself is :class:`~genaug.trainer.reference.train.Trainer`. Exit
status: 0 done, 2 bad data, devices, labels or feeder configuration (nothing trained), 3
stopped on a non-finite loss, 4 ``--doctor`` found a problem (nothing trained), 130
interrupted (Ctrl-C; nothing is saved). Importing this module imports neither TensorFlow nor
numpy (``genaug train --help`` stays fast): the trainer is imported when the command runs.

Example::

    python -m genaug.trainer.reference.command --epochs 1   # the same as: genaug train --epochs 1
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from .config import add_train_arguments, config_from_args

__all__ = ["add_arguments", "interrupted", "main", "run"]


def train_doc_line() -> str:
    """The first line of the reference trainer's docstring (``--help``'s description)."""
    from . import train as train_module

    return (train_module.__doc__ or "").split("\n")[0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``genaug train`` flags: one per :class:`TrainConfig` field, derived there."""
    add_train_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run ``genaug train`` for parsed arguments; print the summary. Returns an exit code:
    0 done, 2 bad data/devices/labels (nothing trained), 3 stopped on a non-finite loss, 4
    ``--doctor`` found a problem (nothing trained)."""
    # The trainer's modules bring numpy (and TensorFlow once it runs): imported here, so
    # that `genaug train --help` imports neither.
    from genaug.feeding.labels import LabelMapError
    from genaug.feeding.preflight import FeederConfigError

    from ..checks.audit import PythonInGraphError
    from ..checks.instruments import NonFiniteLossError
    from ..hardware.devices import DeviceError
    from .data import DatasetError
    from .train import Trainer

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        for noisy in ("tensorflow", "absl", "httpx"):  # per-step "Reduce to ..." INFO lines
            logging.getLogger(noisy).setLevel(logging.WARNING)
    config = config_from_args(args)
    if (config.service is None) != (config.recipe is None and not config.prompts):
        if config.service is None:
            print("genaug train: error: --recipe/--prompt need --service URL", file=sys.stderr)
            return 2
        print("genaug train: error: --service needs --recipe NAME or --prompt LABEL=TEXT",
              file=sys.stderr)
        return 2
    try:
        with Trainer(config) as trainer:
            trainer.prepare()
            if config.doctor and not trainer.diagnose().ok:
                print("genaug train: stopped before training: --doctor found the problem(s) "
                      "above, each with its fix; nothing was trained", file=sys.stderr)
                return 4
            summary = trainer.fit()
    except (DatasetError, LabelMapError, DeviceError, PythonInGraphError,
            FeederConfigError) as exc:
        print(f"genaug train: error: {exc}", file=sys.stderr)
        return 2
    except NonFiniteLossError as exc:
        print(f"genaug train: stopped: {exc}", file=sys.stderr)
        return 3
    print(summary.format())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m genaug.trainer.reference.command [flags]`` (the same as ``genaug train``)."""
    parser = argparse.ArgumentParser(prog="genaug train", description=train_doc_line())
    add_arguments(parser)
    return run(parser.parse_args(argv))


def interrupted(args: argparse.Namespace) -> str:
    return "nothing is saved (the reference trainer keeps no checkpoint); run it again"


if __name__ == "__main__":
    sys.exit(main())
