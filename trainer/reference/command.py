"""The ``genaug train`` command: parsed flags in, a summary printed and an exit status out.

Exit status: 0 done, 2 bad data, devices, labels or feeder configuration (nothing trained), 3
stopped on a non-finite loss, 4 ``--doctor`` found a problem (nothing trained). The trainer
itself is :class:`~genaug.trainer.reference.train.Trainer`; every flag is a
:class:`~genaug.trainer.reference.config.TrainConfig` field.

Example::

    python -m genaug.trainer.reference.command --epochs 1   # the same as: genaug train --epochs 1
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from ..checks.instruments import NonFiniteLossError
from ..feeding.labels import LabelMapError
from ..hardware.devices import DeviceError
from . import train as train_module
from .config import add_train_arguments, config_from_args
from .data import DatasetError
from .train import Trainer

__all__ = ["main", "run_train"]


def train_doc_line() -> str:
    """The first line of the reference trainer's docstring (``--help``'s description)."""
    return (train_module.__doc__ or "").split("\n")[0]


def run_train(args: argparse.Namespace) -> int:
    """Run ``genaug train`` for parsed arguments; print the summary. Returns an exit code:
    0 done, 2 bad data/devices/labels (nothing trained), 3 stopped on a non-finite loss, 4
    ``--doctor`` found a problem (nothing trained)."""
    from ..checks.audit import PythonInGraphError
    from ..feeding.preflight import FeederConfigError

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        for noisy in ("tensorflow", "absl", "httpx"):  # per-step "Reduce to ..." INFO lines
            logging.getLogger(noisy).setLevel(logging.WARNING)
    config = config_from_args(args)
    if (config.service is None) != (config.recipe is None and not config.prompts):
        if config.service is None:
            print("genaug train: error: --recipe/--prompt need --service URL", file=sys.stderr)  # noqa: T201
            return 2
        print("genaug train: error: --service needs --recipe NAME or --prompt LABEL=TEXT",  # noqa: T201
              file=sys.stderr)
        return 2
    try:
        with Trainer(config) as trainer:
            trainer.prepare()
            if config.doctor and not trainer.diagnose().ok:
                print("genaug train: stopped before training: --doctor found the problem(s) "  # noqa: T201
                      "above, each with its fix; nothing was trained", file=sys.stderr)
                return 4
            summary = trainer.fit()
    except (DatasetError, LabelMapError, DeviceError, PythonInGraphError,
            FeederConfigError) as exc:
        print(f"genaug train: error: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    except NonFiniteLossError as exc:
        print(f"genaug train: stopped: {exc}", file=sys.stderr)  # noqa: T201
        return 3
    print(summary.format())  # noqa: T201
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m genaug.trainer.reference.command [flags]`` (the same as ``genaug train``)."""
    parser = argparse.ArgumentParser(prog="genaug train", description=train_doc_line())
    add_train_arguments(parser)
    return run_train(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
