"""What a ``genaug gain`` run measures: :class:`GainSettings` (``genaug gain --help`` says
each), and the arms it knows.

Example::

    GainSettings(data=Path("DATA"), recipe="digits", shots=(1, 5), seeds=5).fingerprint()
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from genaug.mixing import AGREEMENT_FLOOR

__all__ = ["ARMS", "DEFAULT_ARMS", "GainSettings"]

#: The built-in arms; ``--extra NAME=DIR`` adds one named NAME.
ARMS = ("real", "pool", "variants", "adapted")
DEFAULT_ARMS = ("real", "pool", "variants")


@dataclass
class GainSettings:
    """What a run measures (``genaug gain --help`` says each)."""

    data: Path
    recipe: str | None = None
    url: str | None = None
    shots: tuple[int, ...] = (1, 5, 10)
    seeds: int = 8
    arms: tuple[str, ...] = DEFAULT_ARMS
    extra: dict[str, str] = field(default_factory=dict)
    framework: str | None = None
    train: str | None = None
    out: Path = Path("gain")
    size: int | None = None
    test_per_label: int | None = None
    per_label: int = 64
    steps: int = 300
    strength: float = 0.5
    match: str = "auto"
    min_agreement: float = AGREEMENT_FLOOR
    share: float | None = None
    validate: int | None = None
    jobs: int | None = None
    api_key: str | None = None
    adapt_model: str | None = None
    adapt_steps: int | None = None
    device: str = "cpu"
    command: str = ""

    def fingerprint(self) -> str:
        """What must match for a run to continue another's cells."""
        keep = {k: v for k, v in asdict(self).items()
                if k not in ("seeds", "arms", "jobs", "out", "api_key", "command", "url",
                             "shots", "extra")}
        keep["data"] = str(Path(self.data).resolve())
        text = json.dumps(keep, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]
