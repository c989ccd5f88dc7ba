"""What ``auto`` keeps in the pool database, typed: a pool's decision (:class:`SamplerRow`
with its :class:`Evidence`) and one sampler's tally on one label (:class:`Tally`), and the
:class:`SamplerRecords` the store implements for them
(:class:`~genaug.service.pool.sampler_queries.SamplerQueries`, ``store.samplers``).

Every sampler is named by its :attr:`~genaug.service.sampling.modes.Sampling.id`.

Example::

    row = SamplerRow(basis, "probing", None, "probing the recipe's own sampler",
                     Evidence(testing="quality:lcm:1:0", why="new pool", since=time.time()))
    Evidence.from_json(row.evidence.to_json()) == row.evidence    # True
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

__all__ = ["Evidence", "SamplerRecords", "SamplerRow", "Tally"]


@dataclass
class Evidence:
    """What a decision rests on besides the tallies: the candidate under test (``testing``),
    the rejected ones with why (``rejected``), the probes wanted per sampler and label beyond
    the first round (``wanted``), why probing began (``why``), when it began (``since``) and
    when it was decided (``decided_at``; seconds since the epoch). Samplers by id."""

    testing: str | None = None
    rejected: dict[str, str] = field(default_factory=dict)
    wanted: dict[str, dict[str, int]] = field(default_factory=dict)
    why: str = "new pool"
    since: float | None = None
    decided_at: float | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Evidence:
        """The evidence a ``samplers`` row holds (keys it lacks take their defaults)."""
        got: dict[str, Any] = json.loads(text)
        return cls(testing=got.get("testing"), rejected=dict(got.get("rejected", {})),
                   wanted={k: dict(v) for k, v in got.get("wanted", {}).items()},
                   why=str(got.get("why", "new pool")), since=got.get("since"),
                   decided_at=got.get("decided_at"))


@dataclass
class SamplerRow:
    """A pool's ``samplers`` row: the basis, the state (``probing``/``decided``), the chosen
    sampler's id, the reason and the evidence."""

    basis: str
    state: str
    sampler: str | None
    reason: str
    evidence: Evidence = field(default_factory=Evidence)


@dataclass
class Tally:
    """One sampler's tally on one label: images judged and kept, and the sum of their unit
    judge embeddings (None: not kept)."""

    judged: int = 0
    kept: int = 0
    embedding: np.ndarray | None = None


class SamplerRecords(Protocol):
    """The pool database's side of ``auto``: a pool's decision, read and written whole, and
    its tallies (``(sampler id, label, adapter hash, tally)`` under one judge)."""

    def read(self, pool_id: str) -> SamplerRow | None: ...

    def write(self, pool_id: str, row: SamplerRow) -> None: ...

    def tallies(self, pool_id: str, judge_key: str) -> Sequence[tuple[str, str, str, Tally]]: ...
