"""What the gain protocols share: a service of the embedded model, ``genaug gain`` against it,
and the issue's goals read off the report.

:func:`measure` serves ``model`` with ``recipes`` (pre-generation off: the pool holds what
``genaug gain`` asks for), runs ``genaug gain`` with the given arguments in a child process
(its progress on this terminal) and returns the report's JSON with the minutes it took.
:func:`goals` reads the issue-57 goals off a summary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["GENAUG_ARMS", "goals", "measure"]

#: The arms that are genaug's (the others are references).
GENAUG_ARMS = ("pool", "variants", "adapted")


def measure(work: Path, *, model: str, recipes: Path, data: Path, gain_args: Sequence[str],
            url: str | None = None) -> dict[str, Any]:
    """``genaug gain DATA --url URL *gain_args --out WORK/report`` against a service of
    ``model`` (started here unless ``url``); the report, plus ``minutes``."""
    from contextlib import ExitStack

    from genaug.client import Client
    from genaug.local_service import free_port, running_service

    with ExitStack() as stack:
        if url is None:
            port = free_port()
            env = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
            env.update(GENAUG_MODEL=model, GENAUG_RECIPES=str(recipes),
                       GENAUG_POOL_PATH=str(work / "pool.db"), GENAUG_PREGENERATE="false")
            stack.enter_context(running_service(port, env=env, log_path=work / "serve.log"))
            url = f"http://127.0.0.1:{port}"
            with Client(url) as client:
                client.wait_ready(timeout=600)
        command = [sys.executable, "-m", "genaug.cli", "gain", str(data), "--url", url,
                   "--out", str(work / "report"), *gain_args]
        started = time.monotonic()
        subprocess.run(command, check=True, cwd=work)
        minutes = (time.monotonic() - started) / 60
    report: dict[str, Any] = json.loads((work / "report" / "gain.json").read_text())
    report["minutes"] = round(minutes, 1)
    return report


def goals(summary: Sequence[dict[str, Any]], *, bars: Sequence[tuple[int, float]] = (),
          reference: str | None = None) -> list[tuple[str, str, str]]:
    """The issue's goals against a report's summary, each ``(goal, measured, verdict)``: per
    ``(k, bar)`` of ``bars`` the best genaug arm at least ``bar`` points with its interval
    above 0; per ``k``, within 2 points of ``reference`` (an ``--extra`` arm) or above; and no
    genaug arm below ``real`` by more than 1 point on the mean at any ``k``."""
    by = {(r["arm"], r["k"]): r for r in summary}
    shots = sorted({r["k"] for r in summary})
    ours = [a for a in GENAUG_ARMS if any(r["arm"] == a for r in summary)]
    out: list[tuple[str, str, str]] = []

    def best(k: int) -> dict[str, Any] | None:
        rows = [by[(a, k)] for a in ours if (a, k) in by]
        return max(rows, key=lambda r: r["mean"]) if rows else None

    def said(row: dict[str, Any]) -> str:
        low, high = row["low"], row["high"]
        return (f"{row['arm']} {row['mean']:+.1f}" if low is None
                else f"{row['arm']} {row['mean']:+.1f} [{low:+.1f}, {high:+.1f}]")

    for k, bar in bars:
        row = best(k)
        if row is None:
            continue
        above = row["low"] is not None and row["low"] > 0
        verdict = ("met" if row["mean"] >= bar and above else
                   f"missed by {max(bar - row['mean'], 0.0):.1f} points"
                   + ("" if above else ", interval holds 0"))
        out.append((f"k={k}: best genaug arm >= +{bar:g}, interval above 0", said(row), verdict))
    if reference is not None:
        for k in shots:
            row, ref = best(k), by.get((reference, k))
            if row is None or ref is None:
                continue
            gap = ref["mean"] - row["mean"]
            out.append((f"k={k}: within 2 points of {reference} or above",
                        f"{said(row)} vs {reference} {ref['mean']:+.1f}",
                        "met" if gap <= 2 else f"missed by {gap - 2:.1f} points"))
    rows = [r for r in summary if r["arm"] in ours]
    if rows:
        low = min(rows, key=lambda r: r["mean"])
        out.append(("no genaug arm below real by more than 1 point (mean), any k",
                    f"lowest: {said(low)} at k={low['k']}",
                    "met" if low["mean"] >= -1 else f"missed by {-1 - low['mean']:.1f} points"))
    return out
