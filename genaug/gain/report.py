"""``genaug gain``'s report: the summary per arm and ``k``, written as JSON, Markdown and a PNG.

:func:`summarise` pairs every arm's cells with ``real``'s of the same ``k`` and seed (seeds
that lack either are left out and counted) and gives, per arm and ``k``: ``mean``, ``low`` and
``high`` in points of accuracy against ``real`` (for ``real`` itself, its accuracy in
percent), ``seeds``, the ``verdict`` (:mod:`~genaug.gain.stats`) and, for an arm, ``unmixed``:
the seeds whose images were left out for not agreeing with the shots' classes (those cells
trained on the shots alone); :func:`verdict_line` says it in one line. :func:`write_report`
writes ``gain.json`` (``summary``, ``cells``, and what the caller adds: settings, the test
split, date, machine, command), ``gain.md`` and ``gain.png`` (accuracy against ``k`` per arm
with its 95 % interval; matplotlib).

Example::

    summary = summarise(cells, arms=["real", "pool"], shots=[1, 5])
    verdict_line(summary[1])   # "pool: +6.1 points [+2.4, +9.8] at k=5 over 10 seeds: helps"
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .stats import mean_interval, paired_interval, verdict

__all__ = ["REAL", "summarise", "verdict_line", "write_report"]

REAL = "real"


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 2)


def summarise(cells: Sequence[Mapping[str, Any]], *, arms: Sequence[str],
              shots: Sequence[int]) -> list[dict[str, Any]]:
    """One row per arm and ``k`` (module doc), in ``arms`` then ``shots`` order; a row
    without any paired seed is left out."""
    accuracy: dict[tuple[str, int], dict[int, float]] = {}
    unmixed: dict[tuple[str, int], set[int]] = {}
    for cell in cells:
        key = (str(cell["arm"]), int(cell["k"]))
        accuracy.setdefault(key, {})[int(cell["seed"])] = float(cell["accuracy"])
        if cell.get("mixed") is False:
            unmixed.setdefault(key, set()).add(int(cell["seed"]))
    rows = []
    for arm in arms:
        for k in shots:
            mine = accuracy.get((arm, k), {})
            real = accuracy.get((REAL, k), {})
            seeds = sorted(set(mine) & set(real))
            if not seeds:
                continue
            if arm == REAL:
                mean, low, high = mean_interval([100 * mine[s] for s in seeds])
                said = "baseline"
            else:
                mean, low, high = paired_interval([100 * (mine[s] - real[s]) for s in seeds])
                said = verdict(low, high)
            row = {"arm": arm, "k": k, "mean": round(mean, 2), "low": _finite(low),
                   "high": _finite(high), "seeds": len(seeds), "verdict": said,
                   "accuracy": round(100 * sum(mine[s] for s in seeds) / len(seeds), 2)}
            if arm != REAL:
                row["unmixed"] = len(unmixed.get((arm, k), set()) & set(seeds))
            rows.append(row)
    return rows


def _points(value: float | None) -> str:
    return "?" if value is None else f"{value:+.1f}"


def verdict_line(row: Mapping[str, Any]) -> str:
    """One row as a sentence (module doc)."""
    if row["arm"] == REAL:
        low, high = row["low"], row["high"]
        interval = "" if low is None else f" [{low:.1f}, {high:.1f}]"
        return (f"real: {row['mean']:.1f} % accuracy{interval} at k={row['k']} over "
                f"{row['seeds']} seeds (the baseline)")
    unmixed = int(row.get("unmixed") or 0)
    note = "" if not unmixed else (
        f" (not mixed on {unmixed} of {row['seeds']} seeds: its images did not agree with "
        "the shots' classes)")
    return (f"{row['arm']}: {row['mean']:+.1f} points [{_points(row['low'])}, "
            f"{_points(row['high'])}] at k={row['k']} over {row['seeds']} seeds: "
            f"{row['verdict']}{note}")


def _markdown(summary: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> str:
    shots = sorted({int(r["k"]) for r in summary})
    arms = list(dict.fromkeys(str(r["arm"]) for r in summary))
    by = {(str(r["arm"]), int(r["k"])): r for r in summary}
    lines = [f"# genaug gain: {meta.get('data', '')}", ""]
    for key in ("date", "machine", "command"):
        if meta.get(key):
            lines.append(f"- {key}: `{meta[key]}`" if key == "command" else f"- {key}: {meta[key]}")
    settings = meta.get("settings", {})
    if settings:
        lines.append("- settings: " + ", ".join(f"{k} {v}" for k, v in settings.items()))
    lines += ["", "Points of test accuracy against `real` on the same seeds (mean and 95 % "
              "interval of the paired differences); `real` is its accuracy in %.", "",
              "| arm | " + " | ".join(f"k={k}" for k in shots) + " |",
              "|---|" + "---|" * len(shots)]
    for arm in arms:
        cells = []
        for k in shots:
            row = by.get((arm, k))
            if row is None:
                cells.append("")
            elif arm == REAL:
                interval = "" if row["low"] is None else f" [{row['low']:.1f}, {row['high']:.1f}]"
                cells.append(f"{row['mean']:.1f} %{interval}")
            else:
                cells.append(f"{row['mean']:+.1f} [{_points(row['low'])}, "
                             f"{_points(row['high'])}] {row['verdict']}")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines += ["", *[f"- {verdict_line(r)}" for r in summary if r["arm"] != REAL], ""]
    return "\n".join(lines)


def _plot(summary: Sequence[Mapping[str, Any]], path: Path, title: str) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    arms = list(dict.fromkeys(str(r["arm"]) for r in summary))
    for offset, arm in enumerate(arms):
        rows = sorted((r for r in summary if r["arm"] == arm), key=lambda r: int(r["k"]))
        ks = [int(r["k"]) * (1 + 0.03 * (offset - len(arms) / 2)) for r in rows]
        acc = [float(r["accuracy"]) for r in rows]
        # The interval is of the difference: drawn around the arm's mean accuracy.
        below = [float(r["mean"] - r["low"]) if r["low"] is not None else 0.0 for r in rows]
        above = [float(r["high"] - r["mean"]) if r["high"] is not None else 0.0 for r in rows]
        ax.errorbar(ks, acc, yerr=[below, above], marker="o", capsize=3, label=arm)
    ax.set_xscale("log")
    shots = sorted({int(r["k"]) for r in summary})
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xticks(shots)
    ax.set_xticklabels([str(k) for k in shots])
    ax.set_xlabel("real shots per label (k)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_report(out: Path, cells: Sequence[Mapping[str, Any]],
                 summary: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]
                 ) -> dict[str, Path]:
    """``gain.json``, ``gain.md`` and ``gain.png`` in ``out`` (module doc); their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "gain.json", "md": out / "gain.md", "png": out / "gain.png"}
    report = {**meta, "summary": list(summary), "cells": list(cells)}
    paths["json"].write_text(json.dumps(report, indent=1) + "\n")
    paths["md"].write_text(_markdown(summary, meta))
    _plot(summary, paths["png"], f"genaug gain: {meta.get('data', '')} (interval: vs real, 95 %)")
    return paths
