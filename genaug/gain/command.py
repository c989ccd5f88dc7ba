"""Does the pool help your model? Paired runs on your folder, with intervals and a verdict

``genaug gain DATA --recipe NAME`` holds out a fixed test split of ``DATA/<label>/*``, and for
each ``k`` of ``--shots`` and each of ``--seeds`` seeds trains the same small classifier on
``k`` real images per label alone (``real``) and with each arm's images mixed in (``pool``:
the recipe's pool on the service at ``--url``; ``variants``: img2img variants of the shots;
``adapted``: a LoRA adapted on the shots; ``--extra NAME=DIR``: images you already have). It
prints one verdict per arm and ``k`` (``pool: +6.1 points [+2.4, +9.8] at k=5 over 8 seeds:
helps``) and writes ``OUT/gain.json``, ``gain.md`` and ``gain.png``. Killed, it continues
from its last finished cell when run again. See docs/gain.md.

    genaug gain DATA --recipe digits [--url URL] [--shots 1,5,10] [--seeds 8]
        [--arms real,pool,variants,adapted] [--extra NAME=DIR]... [--framework tf|torch]
        [--train module:function] [--out DIR]

Exit status: 0 the report is written (whatever it says); 1 the service failed or training
failed; 2 a mistake in the arguments or the data (one line); 130 Ctrl-C (every finished cell is
kept).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from genaug.mixing import AGREEMENT_FLOOR

EXIT_STATUSES = ("exit status: 0 the report is written (its verdicts are information); 1 the "
                 "service or training failed; 2 a mistake in the arguments or the data; 130 "
                 "Ctrl-C (every finished cell is kept: run the same command to continue)")


def _shots(text: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(v) for v in text.split(",") if v.strip()}))
    except ValueError:
        values = ()
    if not values or min(values) < 1 or max(values) > 10_000:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list of whole numbers >= 1, e.g. 1,5,10")
    return values


def _arms(text: str) -> tuple[str, ...]:
    from .settings import ARMS

    arms = tuple(a.strip() for a in text.split(",") if a.strip())
    unknown = [a for a in arms if a not in ARMS]
    if not arms or unknown:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the arms are {', '.join(ARMS)} (comma-separated); --extra NAME=DIR "
            "adds one of your own")
    return arms


def _extra(text: str) -> tuple[str, str]:
    name, sep, folder = text.partition("=")
    if not sep or not name.strip() or not folder.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=DIR (e.g. web=~/retrieved)")
    return name.strip(), folder.strip()


def _unit(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number in [0, 1]")
    return value


def _agreement(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not -1.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not an agreement in [-1, 1]; e.g. 0.1")
    return value


def _strength(text: str) -> float:
    value = _unit(text)
    if value == 0.0:
        raise argparse.ArgumentTypeError("0 makes every variant its source: give (0, 1]")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``genaug gain``'s flags."""
    from genaug.cli import service_url, whole_number

    parser.epilog = EXIT_STATUSES
    parser.add_argument("data", type=Path, help="folder with one sub-folder of images per "
                        "label: DATA/<label>/*.png (PNG or JPEG, any size)")
    parser.add_argument("--recipe", default=None,
                        help="the recipe whose labels are DATA's folders (pool, variants, "
                             "adapted arms)")
    parser.add_argument("--url", type=service_url, default=None,
                        help="the service (default: GENAUG_URL, else http://127.0.0.1:8000)")
    parser.add_argument("--api-key", default=None,
                        help="API key to send (default: GENAUG_API_KEY)")
    parser.add_argument("--shots", type=_shots, default=(1, 5, 10),
                        help="real images per label to train on, each a row (default 1,5,10)")
    parser.add_argument("--seeds", type=whole_number(2, 1000), default=8,
                        help="seeds per k (each draws other shots; default 8: a 95 %% "
                             "interval about +-4 points wide on a few-shot task)")
    parser.add_argument("--arms", type=_arms, default=("real", "pool", "variants"),
                        help="real, pool, variants, adapted (default real,pool,variants; "
                             "adapted trains a LoRA per k and seed: minutes each)")
    parser.add_argument("--extra", type=_extra, action="append", default=[],
                        metavar="NAME=DIR", help="an arm of images you already have, "
                        "DIR/<label>/*; repeatable")
    parser.add_argument("--framework", choices=("tf", "torch"), default=None,
                        help="the built-in classifier's framework (default: torch if "
                             "installed, else TensorFlow)")
    parser.add_argument("--train", default=None, metavar="MODULE:FUNCTION",
                        help="your own training function instead of the built-in classifier "
                             "(docs/gain.md)")
    parser.add_argument("--out", type=Path, default=Path("gain"),
                        help="the report and the run's work (default ./gain)")
    parser.add_argument("--size", type=whole_number(8, 512), default=None,
                        help="the classifier's input side (default: the images' median side, "
                             "within 16..32)")
    parser.add_argument("--test-per-label", type=whole_number(1), default=None,
                        help="test images held out per label (default: a quarter of the "
                             "smallest label, 10..100)")
    parser.add_argument("--per-label", type=whole_number(1, 10_000), default=64,
                        help="synthetic images per label each arm mixes in (default 64)")
    parser.add_argument("--steps", type=whole_number(1, 100_000), default=300,
                        help="training steps of every cell (default 300)")
    parser.add_argument("--strength", type=_strength, default=0.5,
                        help="img2img strength of the variants (default 0.5)")
    parser.add_argument("--share", type=_unit, default=None,
                        help="synthetic share of the training examples (default: 0.5 at "
                             "k <= 2, then 2 / (k + 2): the mixing's default)")
    parser.add_argument("--validate", type=whole_number(1, 10_000), default=None, metavar="N",
                        help="score every cell on N images per label of the training side "
                             "(never shots, never the test split) instead of the test split: "
                             "to choose settings, then measure once on the test split")
    parser.add_argument("--match", choices=("auto", "none"), default="auto",
                        help="bring synthetic images to the shots' framing and light "
                             "(default auto; none: resized whole)")
    parser.add_argument("--min-agreement", type=_agreement, default=AGREEMENT_FLOOR,
                        metavar="A",
                        help="with --match auto, mix a cell's images only when their labels "
                             "agree with the shots' classes by at least A (genaug.match."
                             f"agreement, -1 to 1; default {AGREEMENT_FLOOR}; -1: always mix)")
    parser.add_argument("--jobs", type=whole_number(1, 256), default=None,
                        help="training processes at once (default: one per CPU)")
    parser.add_argument("--adapt-model", default=None,
                        help="adapted: the base model genaug adapt trains on (default: the "
                             "service's when it is built in, e.g. tiny-digits)")
    parser.add_argument("--adapt-steps", type=whole_number(1, 100_000), default=None,
                        help="adapted: genaug adapt's --steps (default: its own)")
    parser.add_argument("--device", default="cpu",
                        help="adapted: the device genaug adapt and its service use")


def run(args: argparse.Namespace) -> int:
    """``genaug gain``: measure, print the verdicts, write the report."""
    from .data import GainInputError
    from .run import GainSettings, run_gain

    settings = GainSettings(
        data=args.data, recipe=args.recipe, url=args.url, shots=args.shots, seeds=args.seeds,
        arms=args.arms, extra=dict(args.extra), framework=args.framework, train=args.train,
        out=args.out, size=args.size, test_per_label=args.test_per_label,
        per_label=args.per_label, steps=args.steps, strength=args.strength, share=args.share,
        validate=args.validate, min_agreement=args.min_agreement,
        match=args.match, jobs=args.jobs, api_key=args.api_key, adapt_model=args.adapt_model,
        adapt_steps=args.adapt_steps, device=args.device,
        command="genaug gain " + shlex.join(sys.argv[2:]) if len(sys.argv) > 2 else "")

    def say(line: str) -> None:
        print(f"genaug gain: {line}", file=sys.stderr, flush=True)

    bar = _Progress()
    try:
        report = run_gain(settings, say=say, progress=bar.update)
    except GainInputError as exc:
        bar.close()
        print(f"genaug gain: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        bar.close()
        print(f"genaug gain: {exc}", file=sys.stderr)
        return 1
    bar.close()
    for line in report.lines:
        print(line)
    print(f"report: {report.paths['md']} ({report.paths['json'].name}, "
          f"{report.paths['png'].name})")
    return 0


def interrupted(args: argparse.Namespace) -> str:
    """What Ctrl-C leaves: every finished cell; the same command continues."""
    return (f"every finished cell is kept in {args.out}/gain-cells.jsonl; run the same command "
            "to continue")


class _Progress:
    """Cells done, with the time left, on stderr (a bar where a terminal is attached)."""

    def __init__(self) -> None:
        self._bar: Any = None
        self._said = -1
        self._first: float | None = None  # when the first cell finished: training's pace

    def update(self, done: int, total: int) -> None:
        if sys.stderr.isatty():
            if self._bar is None:
                from tqdm import tqdm

                self._bar = tqdm(total=total, unit="cell", desc="genaug gain", leave=False)
            self._bar.n = done
            self._bar.refresh()
            return
        now = time.monotonic()
        if self._first is None:
            self._first = now
        step = max(1, total // 10)
        if done == total or done // step != self._said:
            self._said = done // step
            pace = (now - self._first) / (done - 1) if done > 1 else None
            left = "" if pace is None else f", about {pace * (total - done) / 60:.1f} min left"
            print(f"genaug gain: {done} of {total} cells trained{left}", file=sys.stderr,
                  flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
