"""The ``genaug`` command.

Subcommands import only what they need: ``serve`` loads torch, ``train`` loads tensorflow,
and no command loads both.

    genaug serve [--port 8000] [--model PATH] ...   every setting is also a GENAUG_* variable
    genaug demo [--out genaug-demo.png]             service + client on the tiny default
    genaug pregenerate --recipe NAME --per-label N [--url URL]
    genaug export --recipe NAME --out DIR
    genaug pool list | genaug pool drop POOL_ID
    genaug train --data DIR [--service URL --recipe NAME --p 0.5] [--gpus 1,2,3,4]
    genaug convert-unet SRC DST [--base MODEL] --trust-this-file
    genaug adapt DATA --recipes FILE --recipe NAME --out OUT.safetensors [--steps N] ...
    genaug doctor [--url URL] [--recipe NAME] [--json]   check this host and the service
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path


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
        from genaug.service.commands.serve import serve
    except ImportError as exc:
        print(f"genaug serve needs the service extras: pip install 'genaug[service]' ({exc})",
              file=sys.stderr)
        return 2

    overrides = {k: v for k, v in vars(args).items() if k not in {"command", "func", "lora"}}
    loras = list(getattr(args, "lora", []))
    if loras:  # --lora a=x --lora b=y, together with --loras / GENAUG_LORAS if given
        overrides["loras"] = ",".join([*([overrides["loras"]] if "loras" in overrides else []),
                                       *loras])
    code: int = serve(overrides)
    return code


def _cmd_demo(args: argparse.Namespace) -> int:
    from genaug.demo import run_demo

    code: int = run_demo(out=args.out, port=args.port, train=not args.no_train)
    return code


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; ``command`` (the first argument) lets heavy subcommands add their flags
    only when they run (``train``'s flags come from the trainer package)."""
    parser = argparse.ArgumentParser(
        prog="genaug",
        description="Out-of-process generative augmentation for deep-learning training.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the generation service")
    _settings_flags(serve)
    serve.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                       help="a LoRA adapter a recipe or request may name; repeatable (adds to "
                            "--loras / GENAUG_LORAS)")
    serve.set_defaults(func=_cmd_serve)

    demo = sub.add_parser(
        "demo", help="the full loop on the tiny model: service, grid, pool, training, stop"
    )
    demo.add_argument("--out", default="genaug-demo.png", help="where to write the grid PNG")
    demo.add_argument("--port", type=int, default=0, help="port (0: a free one)")
    demo.add_argument("--no-train", action="store_true",
                      help="stop after the grid and the pool (no TensorFlow needed)")
    demo.set_defaults(func=_cmd_demo)

    pregen = sub.add_parser("pregenerate", help="fill a recipe's pool, with progress bars")
    amount = pregen.add_mutually_exclusive_group(required=True)
    amount.add_argument("--per-label", type=int, help="fill every label to this many images")
    amount.add_argument("--images", type=int,
                        help="this many more images, split over the labels by the trainers' "
                             "need and recent demand (needs --url)")
    pregen.add_argument("--url", default=None,
                        help="a running service to fill (default: generate in this process)")
    _pool_arguments(pregen)
    pregen.set_defaults(func=_cmd_pregenerate)

    export = sub.add_parser("export", help="write a recipe's pool as OUT/<label>/<seed>.png")
    export.add_argument("--out", required=True, help="output folder")
    export.add_argument("--pool", default=None, help="pool id, when the file holds several")
    _pool_arguments(export)
    export.set_defaults(func=_cmd_export)

    pool = sub.add_parser("pool", help="list the pools in the pool database, or drop one")
    pool_sub = pool.add_subparsers(dest="pool_command", required=True)
    pool_list = pool_sub.add_parser("list", help="pool ids with their image counts")
    _pool_location(pool_list)
    pool_drop = pool_sub.add_parser("drop", help="delete one pool's images and counters")
    pool_drop.add_argument("pool_id", help="exact pool id, as `genaug pool list` shows it")
    _pool_location(pool_drop)
    pool.set_defaults(func=_cmd_pool)

    convert = sub.add_parser(
        "convert-unet", help="turn a fine-tuned UNet checkpoint you trust into safetensors"
    )
    with contextlib.suppress(ImportError):  # a trainer-only install: the command says so
        from genaug.service.commands.convert_unet import add_convert_arguments

        add_convert_arguments(convert)
    convert.set_defaults(func=_cmd_convert_unet)

    adapt = sub.add_parser("adapt", help="train a LoRA on DATA/<label>/*.png for the served model")
    if command == "adapt":
        with contextlib.suppress(ImportError):  # a trainer-only install: _cmd_adapt says so
            from genaug.service.commands.adapt import add_adapt_arguments

            add_adapt_arguments(adapt)
    adapt.set_defaults(func=_cmd_adapt)

    train = sub.add_parser("train", help="the reference TensorFlow trainer")
    if command == "train":
        try:
            from genaug.trainer.reference.config import add_train_arguments
        except ImportError:  # a service-only install: _cmd_train says what to install
            pass
        else:
            add_train_arguments(train)
    train.set_defaults(func=_cmd_train)

    doctor = sub.add_parser(
        "doctor", help="check the service, the recipe's pool, GPUs, XLA, versions and memory "
                       "before training (exit 1 on a failed check)")
    if command == "doctor":
        with contextlib.suppress(ImportError):  # no client extras: _cmd_doctor says so
            from genaug.doctor import add_doctor_arguments

            add_doctor_arguments(doctor)
    doctor.set_defaults(func=_cmd_doctor)
    return parser


def _pool_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipe", required=True, help="recipe name")
    parser.add_argument("--recipes", type=Path, default=None,
                        help="recipe file (default: GENAUG_RECIPES)")
    _pool_location(parser)


def _pool_location(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pool-path", type=Path, default=None,
                        help="SQLite pool file (default: GENAUG_POOL_PATH)")
    parser.add_argument("--pool-url", default=None,
                        help="PostgreSQL pool, postgresql://... (default: GENAUG_POOL_URL)")


def _cmd_pool(args: argparse.Namespace) -> int:
    from genaug.service.commands.pool import run_pool

    code: int = run_pool(args)
    return code


def _cmd_pregenerate(args: argparse.Namespace) -> int:
    from genaug.service.commands.pool import run_pregenerate

    code: int = run_pregenerate(args)
    return code


def _cmd_export(args: argparse.Namespace) -> int:
    from genaug.service.commands.pool import run_export

    code: int = run_export(args)
    return code


def _run_from(module: str, function: str, command: str, extra: str, args: argparse.Namespace
              ) -> int:
    """Import ``module`` only now and run its ``function(args)``; without the extra it needs,
    say which to install (exit 2)."""
    import importlib

    try:
        run = getattr(importlib.import_module(module), function)
    except ImportError as exc:
        print(f"genaug {command} needs the {extra} extras: pip install 'genaug[{extra}]' "
              f"({exc})", file=sys.stderr)
        return 2
    code: int = run(args)
    return code


def _cmd_convert_unet(args: argparse.Namespace) -> int:
    return _run_from("genaug.service.commands.convert_unet", "run_convert", "convert-unet",
                     "service", args)


def _cmd_adapt(args: argparse.Namespace) -> int:
    return _run_from("genaug.service.commands.adapt", "run_adapt", "adapt", "service", args)


def _cmd_train(args: argparse.Namespace) -> int:
    return _run_from("genaug.trainer.reference.command", "run_train", "train", "trainer", args)


def _cmd_doctor(args: argparse.Namespace) -> int:
    return _run_from("genaug.doctor", "run_doctor", "doctor", "client", args)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
