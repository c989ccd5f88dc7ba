"""The ``genaug`` command: one table of subcommands, each pointing straight at its module.

Every subcommand is one module of one shape (its docstring begins with its one-line help,
``add_arguments(parser)`` adds its flags, ``run(args) -> int`` runs it), listed once in
:data:`COMMANDS` with that help line and the extra it needs. ``genaug --help`` reads the table
and imports no command module; ``genaug CMD ...`` imports only CMD's. A command module
imports nothing heavy at import (torch, TensorFlow and numpy come inside ``run``): ``serve``
loads torch, ``train`` loads tensorflow, no command loads both.

    genaug serve [--port 8000] [--model PATH] ...   every setting is also a GENAUG_* variable
    genaug demo [--out genaug-demo.png]             service + client on the tiny default
    genaug pregenerate --recipe NAME --per-label N [--url URL]
    genaug export --recipe NAME --out DIR
    genaug pool list | genaug pool drop POOL_ID
    genaug jobs list | show ID | wait ID | cancel ID | forget ID [--url URL]   a service's fills
    genaug train --data DIR [--service URL --recipe NAME --p 0.5] [--gpus 1,2,3,4]
    genaug convert-unet SRC DST [--base MODEL] --trust-this-file
    genaug adapt DATA --recipes FILE --recipe NAME --out OUT.safetensors [--steps N] ...
    genaug gain DATA --recipe NAME [--shots 1,5,10] [--seeds 8]   does the pool help?
    genaug doctor [--url URL] [--recipe NAME] [--json]   check this host and the service

A flag's value is checked by the type its parser gives it (:func:`service_url`,
:func:`whole_number`, :func:`number`, :func:`seconds`, :data:`share`, :data:`port`, from
:mod:`genaug.flags` and importable from here): a bad one is argparse's error line, naming the
flag, the value and what is allowed, and exit status 2, before anything runs.
:func:`genaug.urls.env_url_refusal` says the same of ``GENAUG_URL`` where a command falls back
on it.

A command whose extra is not installed ends in one line naming it (:class:`MissingExtraError`,
exit status 2). Ctrl-C ends every command in one line on stderr, ``genaug COMMAND:
interrupted; <what was kept, what to run>``, and exit status 130 (SIGTERM: ``terminated``,
143), after the command's own cleanup ran (its child processes stopped:
:mod:`genaug.local_service`). A command module may say what its interruption leaves with
``interrupted(args) -> str``.

To add a command: copy a neighbour's module and add its line to :data:`COMMANDS`
(``tests/genaug/test_cli.py`` checks the shape, and that the table, the docstrings and ``--help``
agree).
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType, ModuleType
from typing import NamedTuple

# The flag types, where the command modules import them from (see the module docstring).
from genaug.flags import number as number
from genaug.flags import port as port
from genaug.flags import seconds as seconds
from genaug.flags import service_url as service_url
from genaug.flags import share as share
from genaug.flags import whole_number as whole_number


class Command(NamedTuple):
    """One ``genaug`` subcommand: the module that is the command, its ``--help`` line (the
    first line of that module's docstring, kept here so that ``genaug --help`` imports no
    command) and the extra it needs (``genaug[EXTRA]``)."""

    module: str
    help: str
    extra: str


#: Every ``genaug`` subcommand, in ``--help``'s order.
COMMANDS: dict[str, Command] = {
    "serve": Command("genaug.service.commands.serve", "Run the generation service", "service"),
    "demo": Command("genaug.experiments.demo",
                    "The full loop on the tiny model: service, grid, pool, training, stop",
                    "service"),
    "pregenerate": Command("genaug.service.commands.pregenerate",
                           "Fill a recipe's pool, with progress bars", "service"),
    "export": Command("genaug.service.commands.export",
                      "Write a recipe's pool as OUT/<label>/<seed>.png", "service"),
    "pool": Command("genaug.service.commands.pool",
                    "List the pools in the pool database, or drop one", "service"),
    "jobs": Command("genaug.jobs",
                    "List, show, wait for and cancel the fill jobs of a running service",
                    "client"),
    "convert-unet": Command("genaug.service.commands.convert_unet",
                            "Turn a fine-tuned UNet checkpoint you trust into safetensors",
                            "service"),
    "adapt": Command("genaug.service.commands.adapt",
                     "Train a LoRA on DATA/<label>/*.png for the served model", "service"),
    "train": Command("genaug.trainer.reference.command", "The reference TensorFlow trainer",
                     "trainer"),
    "gain": Command("genaug.gain.command",
                    "Does the pool help your model? Paired runs on your folder, with intervals "
                    "and a verdict", "gain"),
    "doctor": Command("genaug.doctor",
                      "Check the service, the recipe's pool, GPUs, XLA, versions and memory "
                      "before training", "client"),
}


class MissingExtraError(Exception):
    """A command's module, or what it imports, is not installed: the message names the extra
    to install."""


def help_line(module: ModuleType) -> str:
    """A command's one-line help: the first line of its module's docstring."""
    return (module.__doc__ or "").strip().split("\n", 1)[0].rstrip(".")


@contextmanager
def _needs_extra(name: str) -> Iterator[None]:
    """Inside, an ImportError of a module genaug does not ship (torch without ``[service]``,
    tensorflow without ``[trainer]``) becomes :class:`MissingExtraError` naming the command's
    extra. One of genaug's own modules failing to import is a bug, and stays a traceback."""
    try:
        yield
    except ImportError as exc:
        missing = exc.name or ""
        if missing == "genaug" or missing.startswith("genaug."):
            raise
        extra = COMMANDS[name].extra
        raise MissingExtraError(f"genaug {name} needs the {extra} extras: pip install "
                                f"'genaug[{extra}]' ({exc})") from exc


def command_module(name: str) -> ModuleType:
    """Import the module that is ``genaug NAME``; a missing extra is
    :class:`MissingExtraError`."""
    with _needs_extra(name):
        return importlib.import_module(COMMANDS[name].module)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser: every command with its one-line help from :data:`COMMANDS`; ``command``
    (the first argument) gets its flags too, so only the command that runs is imported."""
    parser = argparse.ArgumentParser(
        prog="genaug",
        description="Out-of-process generative augmentation for deep-learning training.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, entry in COMMANDS.items():
        command_parser = sub.add_parser(name, help=entry.help, description=entry.help)
        if name == command:
            module = command_module(name)
            with _needs_extra(name):
                module.add_arguments(command_parser)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is, as Ctrl-C raises ``KeyboardInterrupt``: the same
    cleanup runs (children stopped, files closed) instead of the process vanishing."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` inside the block (main thread only: Python runs
    signal handlers there); the previous handler comes back after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupted_line(command: str | None, args: argparse.Namespace | None,
                     exc: KeyboardInterrupt) -> str:
    """The one line an interrupted command ends with: what happened, and the command's own
    word on what was kept and what to run (its module's ``interrupted(args)``, if any)."""
    what = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
    hint = ""
    if command in COMMANDS and args is not None:
        # parsed arguments mean the module was imported: never import while interrupted
        module = sys.modules.get(COMMANDS[command].module)
        said = getattr(module, "interrupted", None)
        hint = said(args) if callable(said) else ""
    name = f"genaug {command}" if command in COMMANDS else "genaug"
    return f"{name}: {what}" + (f"; {hint}" if hint else "")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args: argparse.Namespace | None = None
    try:
        with _sigterm_raises():
            args = build_parser(argv[0] if argv else None).parse_args(argv)
            with _needs_extra(args.command):
                code: int = command_module(args.command).run(args)
    except MissingExtraError as exc:  # one line: which extra to install
        print(exc, file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: one line, never a traceback
        command = args.command if args is not None else (argv[0] if argv else None)
        print(interrupted_line(command, args, exc), file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
    return code


if __name__ == "__main__":
    sys.exit(main())
