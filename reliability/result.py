"""What a check reports: rows of (what was tried, how many times, what held, what was lost).

A check never raises for a broken promise: it records the row with ``ok=False`` and the
evidence, so the runner can still write every table and the tests can assert on the rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Row:
    """One line of an area's table."""

    what: str
    tried: int | str
    held: str
    lost: str = "nothing"
    ok: bool = True
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Table:
    """A free-form figure table (e.g. latency per request kind)."""

    title: str
    header: list[str]
    rows: list[list[Any]]


@dataclass
class CheckResult:
    """The rows (and figures) one check produced; ``ok`` when every row held."""

    area: str
    name: str
    rows: list[Row] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def add(self, what: str, tried: int | str, held: str, *, lost: str = "nothing",
            ok: bool = True, **details: Any) -> Row:
        row = Row(what, tried, held, lost, ok, details)
        self.rows.append(row)
        return row

    def row(self, what_prefix: str) -> Row:
        """The first row whose ``what`` starts with ``what_prefix`` (for tests)."""
        for r in self.rows:
            if r.what.startswith(what_prefix):
                return r
        raise KeyError(f"no row starting with {what_prefix!r} in {[r.what for r in self.rows]}")

    def failures(self) -> list[Row]:
        return [r for r in self.rows if not r.ok]

    def explain(self) -> str:
        """A readable summary of the failed rows (assertion messages)."""
        return "\n".join(
            f"[{self.name}] {r.what}: held={r.held!r} lost={r.lost!r} "
            f"details={r.details}"
            for r in self.failures()
        ) or f"[{self.name}] all {len(self.rows)} rows held"


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def ms(seconds: float) -> str:
    return "–" if math.isnan(seconds) else f"{seconds * 1000:.0f} ms"
