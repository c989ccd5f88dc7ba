"""The pool's vocabulary, shared by the store, its backends, the factory and the planner.

- Errors: :class:`PoolError` and its kinds, :class:`PoolConfigError` (settings that can never
  work), :class:`PoolConnectionError` (the database is unreachable now; retry later) and
  :class:`PoolSchemaError` (a database newer than this genaug).
- Values: :class:`LabelStats` (one label's counts), :class:`Reservation` (plan indices handed
  to one planner), :class:`PoolSample` (images drawn from a pool), and for curation
  :class:`PoolImage` / :class:`BrowsePage` (a label's images as a person looks through them)
  and :class:`VerdictResult` (what a person's reject or restore changed); for the manifest
  :class:`Provenance` (what made a batch beyond the recipe) and :class:`PoolRecord` (one
  stored image as exported). A fill job's type is the jobs package's
  (:mod:`genaug.service.jobs.types`).
- :func:`parse_partition` (``GENAUG_REPLICA=i/N``) and the constants every backend agrees on
  (:data:`SCHEMA_VERSION`, :data:`PG_SCHEMES`, :data:`DEFAULT_LEASE_S`).

A leaf: numpy only, no backend, no settings.

Example::

    parse_partition("1/2")                     # (1, 2)
    LabelStats(fill=3, generated=5).as_dict()  # {"fill": 3, "generated": 5, ...}
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "DEFAULT_LEASE_S",
    "AddedBatch",
    "BatchMade",
    "BrowsePage",
    "LabelStats",
    "PG_SCHEMES",
    "PoolConfigError",
    "PoolConnectionError",
    "PoolError",
    "PoolImage",
    "PoolRecord",
    "PoolSample",
    "PoolSchemaError",
    "Provenance",
    "Reservation",
    "SCHEMA_VERSION",
    "VerdictResult",
    "parse_partition",
]

#: The database layout this genaug writes; older ones are upgraded in place, newer refused.
SCHEMA_VERSION = 7
#: URL schemes of a PostgreSQL pool (anything else is a SQLite path).
PG_SCHEMES = ("postgresql://", "postgres://")
#: Seconds a reservation lives without its owner's heartbeat.
DEFAULT_LEASE_S = 60.0


class PoolError(RuntimeError):
    """The pool database cannot be opened or used; the message says why and what to do."""


class PoolConfigError(PoolError):
    """The pool settings can never work (bad URL, both a URL and a path, bad partition)."""


class PoolConnectionError(PoolError):
    """The pool database is unreachable now (outage, restart); retrying later may work."""


class PoolSchemaError(PoolError):
    """The database's schema is newer than this genaug knows; the message says what to do."""


@dataclass(frozen=True)
class LabelStats:
    """Counts for one label of one pool, read in one snapshot.

    ``fill``: images stored now that a sample may return (the *accepted* ones: the judge kept
    them or a person restored them, and no person rejected them); fill targets, the capacity
    and the planner compare to this. ``generated``: images ever added; ``served``: images
    ever served; ``next_index``: plan indices ever handed out; ``fill_served``: sum of the
    served counts of the accepted images (``fill_served / fill`` is how worn the label is);
    ``reserved``: images planned and not stored yet (live reservations of every replica);
    ``target``: the fill asked for through the database (fill requests, waiting samples).

    Curation (stored images only, so eviction lowers them): ``accepted`` (the same number as
    ``fill``), ``rejected`` (below the judge's ``min_score`` and not restored by a person),
    ``rejected_by_person`` (a person's reject, whatever the judge said). Lifetime counters
    (never lowered by eviction): ``judged_total`` (images ever stored with a judge's score)
    and ``accepted_total`` (of those, how many the judge kept: the acceptance rate is
    ``accepted_total / judged_total``; a person's verdict does not change either).
    """

    fill: int = 0
    generated: int = 0
    served: int = 0
    next_index: int = 0
    fill_served: int = 0
    reserved: int = 0
    target: int = 0
    accepted: int = 0
    rejected: int = 0
    rejected_by_person: int = 0
    judged_total: int = 0
    accepted_total: int = 0
    #: When the newest image stored now was added (seconds since the epoch; None: none).
    newest: float | None = None

    def as_dict(self) -> dict[str, int]:
        """The counts (what a recipe's detail shows per label), without ``newest``."""
        out = asdict(self)
        del out["newest"]
        return out


@dataclass(frozen=True)
class Reservation:
    """Plan indices handed to one planner: ``start, start + stride, ...`` (``count`` of them).

    Recorded in the database with a lease until
    :meth:`~genaug.service.pool.store.PoolStore.add` stores its images or
    :meth:`~genaug.service.pool.store.PoolStore.release` gives it back.
    """

    id: int
    pool_id: str
    label: str
    start: int
    stride: int
    count: int

    @property
    def indices(self) -> list[int]:
        return [self.start + k * self.stride for k in range(self.count)]


@dataclass(frozen=True)
class PoolSample:
    """Images drawn from a pool, grouped by label in the order the labels were requested.

    ``images`` uint8 [n, h, w, c] (writable; shape (0, 0, 0, 3) when nothing was available),
    ``labels`` the label name of each image, ``seeds`` int64 [n], ``sources`` the source hash
    of each image (img2img variants) or None.
    """

    images: npt.NDArray[np.uint8]
    labels: list[str]
    seeds: npt.NDArray[np.int64]
    sources: list[str | None] | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def label_indices(self, label_names: Sequence[str]) -> npt.NDArray[np.int32]:
        """int32 index of each image's label in ``label_names`` (e.g. a recipe's labels)."""
        index = {name: i for i, name in enumerate(label_names)}
        try:
            return np.fromiter((index[x] for x in self.labels), np.int32, len(self.labels))
        except KeyError as exc:
            raise KeyError(f"label {exc.args[0]!r} is not in {list(label_names)}") from None


@dataclass(frozen=True)
class PoolImage:
    """One stored image as a person looks through a label (no pixels: see
    :meth:`~genaug.service.pool.curation.CurationQueries.image`).

    ``score``: the judge's score (None: not judged); ``judge_keep``: whether the judge kept it
    (True when not judged); ``verdict``: a person's ``"reject"`` or ``"restore"`` (None:
    none); ``accepted``: whether a sample may return it; ``rejected_by``: ``"person"``,
    ``"judge"`` or None (accepted); ``created``: seconds since the epoch.
    """

    seed: int
    score: float | None
    created: float
    served: int
    judge_keep: bool
    verdict: str | None

    @property
    def accepted(self) -> bool:
        return self.verdict == "restore" or (self.verdict is None and self.judge_keep)

    @property
    def rejected_by(self) -> str | None:
        if self.verdict == "reject":
            return "person"
        return None if self.accepted else "judge"

    def as_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "score": self.score,
            "created": self.created,
            "served": self.served,
            "accepted": self.accepted,
            "rejected_by": self.rejected_by,
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class BrowsePage:
    """One page of a label's accepted (or rejected) images: ``total`` of them in all,
    ``images`` from ``offset`` on, the least-scored first (unjudged last), then oldest."""

    total: int
    offset: int
    images: list[PoolImage] = field(default_factory=list)


@dataclass(frozen=True)
class VerdictResult:
    """What :meth:`~genaug.service.pool.curation.CurationQueries.verdict` did.

    ``changed``: seeds whose image now is (``keep``) or is no longer sampleable;
    ``unchanged``: seeds already so; ``unknown``: seeds the label has no image of. When
    ``unknown`` is not empty nothing was applied (all or nothing).
    """

    changed: list[int] = field(default_factory=list)
    unchanged: list[int] = field(default_factory=list)
    unknown: list[int] = field(default_factory=list)

    @property
    def applied(self) -> bool:
        return not self.unknown


@dataclass(frozen=True)
class Provenance:
    """What made a pool batch beyond its recipe name and seed, stored with each image (schema
    4; ``speed`` and ``sampler`` schema 6) so an exported image can be remade: ``speed`` the
    mode (quality, turbo; an ``auto`` pool's images say which mode their sampler ran),
    ``sampler`` the :attr:`~genaug.service.sampling.modes.Sampling.id` it was drawn with (schema
    7; a turbo LoRA's kind and hash included), ``steps`` and ``guidance`` the batch ran with,
    ``strength`` for img2img variants (None: text-to-image), ``adapter_hash`` the content
    hash of the LoRA file (None: no adapter, or not known), ``judge_key`` a short hash of
    the judge's settings and ``judge_settings`` their JSON (None: no judge). An image stored
    before schema 4 reads None for each: not recorded. Example::

        Provenance(steps=30, guidance=5.0, judge_key="3f9c0a1b2c3d4e5f",
                   judge_settings='{"encoder": "tiny-digits-encoder", "min_score": 0.9}')
    """

    steps: int | None = None
    guidance: float | None = None
    strength: float | None = None
    adapter_hash: str | None = None
    judge_key: str | None = None
    judge_settings: str | None = None
    speed: str | None = None
    sampler: str | None = None


@dataclass(frozen=True)
class BatchMade:
    """What made a pool batch, stored with each of its images: the scheduler its key ran, the
    adapter and its scale (None: none), and the :class:`Provenance`. The planner names it for
    each batch it plans; :meth:`~genaug.service.pool.store.PoolStore.add` takes its fields
    (:meth:`as_add_options`)."""

    scheduler: str = "default"
    adapter: str | None = None
    adapter_scale: float | None = None
    provenance: Provenance = field(default_factory=Provenance)

    def as_add_options(self) -> dict[str, Any]:
        """The keyword arguments of ``store.add`` that this record fills."""
        return {"scheduler": self.scheduler, "adapter": self.adapter,
                "adapter_scale": self.adapter_scale, "provenance": self.provenance}


@dataclass(frozen=True)
class AddedBatch:
    """What one add stored, as the store's add listeners hear it (``store.on_added``, in the
    add's transaction): the pool and label, what made the batch, how many of its images the
    judge scored and kept, and the sum of their unit judge embeddings (None: not given)."""

    pool_id: str
    label: str
    provenance: Provenance
    judged: int
    kept: int
    embedding_sum: Sequence[float] | None = None


@dataclass(frozen=True)
class PoolRecord:
    """One stored image with everything the pool knows of it (``genaug export``'s manifest
    row): see :meth:`~genaug.service.pool.reads.PoolReads.iter_records`. ``provenance``
    fields are None for images stored before schema 4 (not recorded, never guessed)."""

    label: str
    seed: int
    image: npt.NDArray[np.uint8]
    plan_index: int | None
    created: float
    model_hash: str
    scheduler: str
    adapter: str | None
    adapter_scale: float | None
    source: str | None
    score: float | None
    judge_keep: bool
    verdict: str | None
    verdict_at: float | None
    accepted: bool
    provenance: Provenance


def parse_partition(text: str | None) -> tuple[int, int] | None:
    """``"i/N"`` -> ``(i, N)`` with ``0 <= i < N``; None or "" -> None."""
    if not text:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if match is None or not (0 <= int(match.group(1)) < int(match.group(2))):
        raise PoolConfigError(
            f"GENAUG_REPLICA={text!r} is not i/N with 0 <= i < N; write e.g. 0/2 and 1/2 "
            "for two replicas"
        )
    return int(match.group(1)), int(match.group(2))
