"""The ``genaug`` command: one table of subcommands, each a module of :mod:`genaug.commands`.

Every subcommand has the same shape (its module's docstring begins with its one-line help,
``add_arguments(parser)`` adds its flags, ``run(args) -> int`` runs it) and is listed once in
:data:`COMMANDS`. A command's flags are added, and its library imported, only when that
command runs: ``serve`` loads torch, ``train`` loads tensorflow, no command loads both, and
``genaug --help`` loads neither.

    genaug serve [--port 8000] [--model PATH] ...   every setting is also a GENAUG_* variable
    genaug demo [--out genaug-demo.png]             service + client on the tiny default
    genaug pregenerate --recipe NAME --per-label N [--url URL]
    genaug export --recipe NAME --out DIR
    genaug pool list | genaug pool drop POOL_ID
    genaug train --data DIR [--service URL --recipe NAME --p 0.5] [--gpus 1,2,3,4]
    genaug convert-unet SRC DST [--base MODEL] --trust-this-file
    genaug adapt DATA --recipes FILE --recipe NAME --out OUT.safetensors [--steps N] ...
    genaug doctor [--url URL] [--recipe NAME] [--json]   check this host and the service

Ctrl-C ends every command in one line on stderr, ``genaug COMMAND: interrupted; <what was
kept, what to run>``, and exit status 130 (SIGTERM: ``terminated``, 143), after the command's
own cleanup ran (its child processes stopped: :mod:`genaug.local_service`). A command module
may say what its interruption leaves with ``interrupted(args) -> str``.
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

from genaug.commands import MissingExtraError

#: Every ``genaug`` subcommand, in ``--help``'s order: its name and the module that holds it.
COMMANDS: dict[str, str] = {
    "serve": "genaug.commands.serve",
    "demo": "genaug.commands.demo",
    "pregenerate": "genaug.commands.pregenerate",
    "export": "genaug.commands.export",
    "pool": "genaug.commands.pool",
    "convert-unet": "genaug.commands.convert_unet",
    "adapt": "genaug.commands.adapt",
    "train": "genaug.commands.train",
    "doctor": "genaug.commands.doctor",
}


def help_line(module: ModuleType) -> str:
    """A command's one-line help: the first line of its module's docstring."""
    return (module.__doc__ or "").strip().split("\n", 1)[0].rstrip(".")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser: every command with its one-line help; ``command`` (the first argument) gets
    its flags too, so only the command that runs imports what its flags need."""
    parser = argparse.ArgumentParser(
        prog="genaug",
        description="Out-of-process generative augmentation for deep-learning training.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, path in COMMANDS.items():
        module = importlib.import_module(path)
        line = help_line(module)
        command_parser = sub.add_parser(name, help=line, description=line)
        if name == command:
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
        said = getattr(importlib.import_module(COMMANDS[command]), "interrupted", None)
        hint = said(args) if callable(said) else ""
    name = f"genaug {command}" if command in COMMANDS else "genaug"
    return f"{name}: {what}" + (f"; {hint}" if hint else "")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args: argparse.Namespace | None = None
    try:
        with _sigterm_raises():
            args = build_parser(argv[0] if argv else None).parse_args(argv)
            code: int = importlib.import_module(COMMANDS[args.command]).run(args)
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
