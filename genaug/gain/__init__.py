"""``genaug gain``: does a pool help your model? Paired runs on your own folder of images.

For each ``k`` real shots per label and each seed it trains one classifier on the shots alone
and one per arm with synthetic images mixed in (the recipe's pool, img2img variants of the
shots, a LoRA adapted on them, images you already have), all on the same shots, steps and
initialisation, and scores each on one fixed test split; the report gives each arm's paired
difference from ``real`` with its 95 % interval and a verdict (``helps``, ``no measurable
gain``, ``hurts``). docs/gain.md tells the protocol, the options and how to read it.

Example::

    from pathlib import Path
    from genaug.gain import GainSettings, run_gain

    report = run_gain(GainSettings(data=Path("DATA"), recipe="digits", shots=(1, 5), seeds=5))
    report.lines   # ["pool: +6.1 points [+2.4, +9.8] at k=5 over 5 seeds: helps", ...]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .data import GainInputError
    from .run import GainReport, run_gain
    from .settings import ARMS, DEFAULT_ARMS, GainSettings

__all__ = ["ARMS", "DEFAULT_ARMS", "GainInputError", "GainReport", "GainSettings", "run_gain"]

#: Where each public name lives: imported on first use, so that ``genaug gain --help`` (which
#: imports this package for its command module) loads neither numpy nor the client.
_HOMES = {"GainInputError": "data", "GainReport": "run", "run_gain": "run", "ARMS": "settings",
          "DEFAULT_ARMS": "settings", "GainSettings": "settings"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'genaug.gain' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
