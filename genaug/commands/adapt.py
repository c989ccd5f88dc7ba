"""Train a LoRA on DATA/<label>/*.png for the served model.

``genaug adapt DATA --recipes FILE --recipe NAME --out OUT.safetensors`` (steps and rank
chosen by the data's size; ends with a check of whether the LoRA draws each label as asked,
``--no-check`` skips it), or ``--check FILE --model MODEL``; the flags and the work are
:mod:`genaug.service.commands.adapt`'s.
"""

from __future__ import annotations

import argparse

from . import library

_LIBRARY = "genaug.service.commands.adapt"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    library(_LIBRARY, "adapt", "service").add_adapt_arguments(parser)


def run(args: argparse.Namespace) -> int:
    code: int = library(_LIBRARY, "adapt", "service").run_adapt(args)
    return code


def interrupted(args: argparse.Namespace) -> str:
    # Ctrl-C during training itself is adapt's own: it saves what was learned and says so.
    return "nothing was written; run the same command again"
