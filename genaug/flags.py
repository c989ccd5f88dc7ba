"""What a command-line flag's value may be: the argparse types every ``genaug`` command uses.

A flag given one of these types refuses a bad value as it is parsed: argparse prints its one
error line (``genaug CMD: error: argument --flag: '-4' is not a whole number >= 1``), naming
the flag, the value and what is allowed, and exits with status 2 before anything runs.
:mod:`genaug.cli` re-exports them for the command modules; the reference trainer's
configuration (:mod:`genaug.trainer.reference.config`), which is no command module, declares
its fields' types with them here. Imports nothing of genaug but :mod:`genaug.urls` (the
base: every package may use it).

Example::

    parser.add_argument("--per-label", type=whole_number(1), required=True)
    parser.add_argument("--p", type=share, default=0.5)
    parser.add_argument("--timeout", type=seconds(fix="e.g. 2"), default=2.0)
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from genaug.urls import url_problem

__all__ = ["number", "port", "seconds", "service_url", "share", "whole_number"]


def service_url(text: str) -> str:
    """``--url``'s type: an http(s) URL with a host, refused before anything is sent."""
    problem = url_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text.strip()


def _ending(fix: str) -> str:
    return f"; {fix}" if fix else ""


def whole_number(low: int, high: int | None = None, *,
                 fix: str = "") -> Callable[[str], int]:
    """A flag's type: a whole number from ``low`` (to ``high``); ``fix`` ends the refusal."""
    allowed = f"in {low}..{high}" if high is not None else f">= {low}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number {allowed}{_ending(fix)}")
        return value

    parse.__name__ = "whole number"
    return parse


def number(low: float, high: float | None = None, *, above: bool = False,
           what: str = "number", fix: str = "") -> Callable[[str], float]:
    """A flag's type: a finite number from ``low`` (greater than it when ``above``) to
    ``high``; ``what`` names it in the refusal (``'3' is not a share in [0, 1]``) and ``fix``
    ends it. NaN and infinities are refused (no bound holds for them)."""
    if high is not None and not above:
        allowed = f"in [{low:g}, {high:g}]"
    else:
        allowed = (f"> {low:g}" if above else f">= {low:g}") + (
            f" and <= {high:g}" if high is not None else "")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        within = (value > low if above else value >= low) and (high is None or value <= high)
        if not (math.isfinite(value) and within):
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what} {allowed}{_ending(fix)}")
        return value

    parse.__name__ = what
    return parse


def seconds(*, most: float | None = 86_400.0, zero: bool = False,
            fix: str = "") -> Callable[[str], float]:
    """A flag's type: a number of seconds > 0 (>= 0 with ``zero``: "no pause", "no wait"), at
    most ``most`` (a day by default: a socket or a sleep refuses far larger ones; None: any
    finite number); ``fix`` ends the refusal."""
    parse = number(0.0, most, above=not zero, what="number of seconds", fix=fix)
    parse.__name__ = "seconds"
    return parse


#: ``--port``'s type: 0 (a free port) to 65535.
port = whole_number(0, 65535, fix="0 picks a free port")

#: A share of something (a probability, a fraction): a number in [0, 1].
share = number(0.0, 1.0, what="share", fix="0 is none, 1 is all")
