"""Turn a fine-tuned UNet checkpoint you trust into safetensors.

``genaug convert-unet SRC DST [--base MODEL] --trust-this-file``; the flags and the work are
:mod:`genaug.service.commands.convert_unet`'s (it reads pickles only when told to trust them).
"""

from __future__ import annotations

import argparse

from . import library

_LIBRARY = "genaug.service.commands.convert_unet"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    library(_LIBRARY, "convert-unet", "service").add_convert_arguments(parser)


def run(args: argparse.Namespace) -> int:
    code: int = library(_LIBRARY, "convert-unet", "service").run_convert(args)
    return code
