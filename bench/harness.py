"""The benchmarks' contract and what they share: arguments, results, statistics, tables.

Every benchmark is a module of a family package (``bench/service/``, ``bench/pool/``, ...)
with one entry point and the same last two lines::

    def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
        args = parse_args(__doc__ or "", argv)   # --quick, --threads, --json
        ...
        return finish(result, args.json)        # the dict, also written to --json

    if __name__ == "__main__":
        main(run)

``run`` returns what ``--json`` writes, so ``bench.run_all`` and tests call it in-process;
``python -m bench.<family>.<name>`` and ``python -m bench <name>`` run it from the
repository root (:mod:`bench.__main__` lists them all, read from this tree by
:func:`catalogue`). A benchmark with arguments of its own starts from :func:`make_parser`.

Every benchmark compares two or more things *in the same run, interleaved* (A, B, A, B, ...)
and reports ratios: the machine may be shared, so absolute times drift between runs while
the ratio of neighbouring measurements stays meaningful. Child services and thread pinning:
:mod:`bench.services`.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
DEFAULT_THREADS = 1


# -- arguments -----------------------------------------------------------------------------


def make_parser(
    description: str, *, quick: bool | str = True, threads: bool = True
) -> argparse.ArgumentParser:
    """A parser with the common arguments: ``--json`` always, ``--quick`` (``quick`` may be
    its help text) and ``--threads`` unless the benchmark has no such knob; add the
    benchmark's own to it."""
    out = argparse.ArgumentParser(
        prog=_prog(),
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if quick:
        text = quick if isinstance(quick, str) else "CI-size run: the path more than the figures"
        out.add_argument("--quick", action="store_true", help=text)
    if threads:
        out.add_argument(
            "--threads",
            type=int,
            default=DEFAULT_THREADS,
            help="torch intra-op threads, service and in-process alike",
        )
    out.add_argument("--json", type=Path, default=None, help="also write the result here")
    return out


def _prog() -> str | None:
    """``python -m bench.pool.pool_latency`` rather than ``pool_latency.py`` in usage lines."""
    path = Path(sys.argv[0]).resolve()
    if path.suffix != ".py" or not path.is_relative_to(BENCH):
        return None
    return "python -m " + ".".join(path.relative_to(ROOT).with_suffix("").parts)


def parse_args(description: str, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The common arguments only (``--quick``, ``--threads``, ``--json``)."""
    return make_parser(description).parse_args(argv)


def finish(result: dict[str, Any], json_path: Path | None) -> dict[str, Any]:
    """``result``, also written to ``json_path`` when given: the end of every ``run``."""
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2, default=float))
    return result


def main(run: Callable[[list[str]], dict[str, Any]], argv: Sequence[str] | None = None) -> None:
    """Run a benchmark from the command line: ``run(sys.argv[1:])``, exit status 0.

    Children a benchmark starts as scripts (a warm-up in a fresh interpreter, say) import
    ``bench`` too: the repository root goes last on their ``PYTHONPATH`` (last, so that a
    ``PYTHONPATH`` chosen on purpose, as ``bench/gpu/gpu_run.sh`` does, still comes first).
    """
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT)])
    run(list(sys.argv[1:] if argv is None else argv))


# -- the catalogue -------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One benchmark as ``python -m bench`` lists it: read from the source, not imported."""

    family: str  # the package under bench/: "service", "pool", ...
    name: str  # the module: "pool_latency"
    line: str  # the first line of its docstring

    @property
    def module(self) -> str:
        return f"bench.{self.family}.{self.name}"


def first_line(path: Path) -> str:
    """The first line of a module's docstring, without importing it (torch, TensorFlow)."""
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=True) or ""
    return doc.strip().split("\n", 1)[0]


def families() -> dict[str, str]:
    """Family package -> the first line of its docstring, in the order the README gives."""
    order = ("service", "pool", "training", "gain", "gpu")
    found = {p.parent.name for p in BENCH.glob("*/__init__.py")}
    names = [f for f in order if f in found] + sorted(found - set(order))
    return {name: first_line(BENCH / name / "__init__.py") for name in names}


def catalogue() -> list[Entry]:
    """Every benchmark in this tree: each ``bench/<family>/<name>.py`` that defines ``run``
    (a module without one breaks the contract, and fails ``tests/bench/test_bench.py``)."""
    out = []
    for family in families():
        for path in sorted((BENCH / family).glob("*.py")):
            if not path.name.startswith("_"):
                out.append(Entry(family, path.stem, first_line(path)))
    return out


def find(name: str) -> Entry:
    """The benchmark called ``name`` (``pool_latency`` or ``pool.pool_latency``)."""
    for entry in catalogue():
        if name in (entry.name, f"{entry.family}.{entry.name}", entry.module):
            return entry
    raise KeyError(name)


# -- statistics and tables -------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return float(ordered[rank - 1])


def interleave(rounds: int, phases: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Run each phase once per round, alternating the order every round (A B, B A, A B...)
    so neither side always runs first after a pause; return each phase's values."""
    names = list(phases)
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            out[name].append(phases[name]())
    return out


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (prints well in a terminal and pastes into the docs)."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
        return str(value)

    lines = [
        f"\n### {title}",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def goal_text(met: bool) -> str:
    return "met" if met else "MISSED"
