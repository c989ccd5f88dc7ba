"""Run the generation service.

Every flag is also a ``GENAUG_*`` variable (one per :class:`~genaug.service.settings.Settings`
field); only the flags given on the command line override. The service itself is
:func:`genaug.service.commands.serve.serve`; ``python -m genaug.service`` is the same command.
"""

from __future__ import annotations

import argparse

from . import library


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One ``--flag`` per Settings field, and ``--lora NAME=PATH`` (repeatable)."""
    settings = library("genaug.service.settings", "serve", "service")
    for name, info in settings.Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_text = (info.description or "") + f" [GENAUG_{name.upper()}]"
        parser.add_argument(flag, dest=name, default=argparse.SUPPRESS, help=help_text)
    parser.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                        help="a LoRA adapter a recipe or request may name; repeatable (adds to "
                             "--loras / GENAUG_LORAS)")


def run(args: argparse.Namespace) -> int:
    serve = library("genaug.service.commands.serve", "serve", "service").serve
    overrides = {k: v for k, v in vars(args).items() if k not in {"command", "lora"}}
    loras = list(getattr(args, "lora", []))
    if loras:  # --lora a=x --lora b=y, together with --loras / GENAUG_LORAS if given
        overrides["loras"] = ",".join([*([overrides["loras"]] if "loras" in overrides else []),
                                       *loras])
    code: int = serve(overrides)
    return code
