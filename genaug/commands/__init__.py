"""The ``genaug`` subcommands: one module each, all of one shape.

A command module's docstring begins with its one-line help (``genaug --help`` shows it),
``add_arguments(parser)`` adds its flags and ``run(args) -> int`` runs it and returns the exit
status. :data:`genaug.cli.COMMANDS` lists them, name to module, and imports one only when it
runs. A command module imports nothing heavy at import time: the library it calls (torch for
the service's commands, TensorFlow for ``train``) comes through :func:`library` when the
command runs, and an extra that is not installed becomes :class:`MissingExtraError`, one line
that says what to install.

To add a command, copy a neighbour and add its line to :data:`genaug.cli.COMMANDS`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["MissingExtraError", "library"]


class MissingExtraError(Exception):
    """A command's library could not be imported: the message names the extra to install."""


def library(module: str, command: str, extra: str) -> ModuleType:
    """Import ``module`` (the library ``genaug COMMAND`` calls) now; without the ``extra`` it
    needs, raise :class:`MissingExtraError` saying which to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(f"genaug {command} needs the {extra} extras: pip install "
                                f"'genaug[{extra}]' ({exc})") from exc
