"""The ``genaug`` command.

Subcommands import only what they need: ``serve`` loads torch, ``train`` loads tensorflow,
and no command loads both.

    genaug serve [--port 8000] [--model PATH] ...   every setting is also a GENAUG_* variable
    genaug demo [--out genaug-demo.png]             service + client on the tiny default
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _settings_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--flag`` per Settings field; only flags given on the command line override."""
    try:
        from genaug.service.settings import Settings
    except ImportError:  # a trainer-only install: `serve` says what to install when run
        return

    for name, info in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_text = (info.description or "") + f" [GENAUG_{name.upper()}]"
        parser.add_argument(flag, dest=name, default=argparse.SUPPRESS, help=help_text)


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        from genaug.service.runner import serve
    except ImportError as exc:
        print(f"genaug serve needs the service extras: pip install 'genaug[service]' ({exc})",
              file=sys.stderr)
        return 2

    overrides = {k: v for k, v in vars(args).items() if k not in {"command", "func"}}
    return serve(overrides)


def _cmd_demo(args: argparse.Namespace) -> int:
    from genaug.demo import run_demo

    return run_demo(out=args.out, port=args.port)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="genaug",
        description="Out-of-process generative augmentation for deep-learning training.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the generation service")
    _settings_flags(serve)
    serve.set_defaults(func=_cmd_serve)

    demo = sub.add_parser("demo", help="start a tiny service, generate a labelled grid, stop")
    demo.add_argument("--out", default="genaug-demo.png", help="where to write the grid PNG")
    demo.add_argument("--port", type=int, default=0, help="port (0: a free one)")
    demo.set_defaults(func=_cmd_demo)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
