"""Who trains on what: the fixed test split, each seed's shots, and the cells of a run.

**The test split** is fixed for a folder: per label, ``test_per_label`` images drawn with one
permutation (:data:`SPLIT_SEED`) of the label's files in name order, the same for every arm,
``k`` and seed, and written into the report. The rest of each label is where shots come from.

**Shots** are nested: seed ``s`` permutes each label's remaining images once, and its ``k``
shots are the first ``k`` of that order, so the 5 shots of a seed hold its 1 shot and the
variants made of a shot serve every ``k`` that holds it. Every arm of a seed trains on the same
shots (the differences are paired).

A **cell** is one training run: an arm, a ``k``, a seed (:class:`Cell`); its key names it in
the resumable record.

Example::

    split = Split.of(data, test_per_label=50)
    split.shots(data, k=5, seed=3)           # indices into data, k per label
    cells(["real", "pool"], [1, 5], seeds=8)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .data import GainInputError, Images

__all__ = ["SPLIT_SEED", "Cell", "Split", "cells", "default_test_per_label"]

#: The permutation of every label's files that the test split is cut from.
SPLIT_SEED = 20261129


def default_test_per_label(smallest: int, most_shots: int) -> int:
    """Test images per label when none is given: a quarter of the smallest label, between 10
    and 100, leaving at least ``most_shots`` for the shots."""
    return int(max(1, min(100, max(10, smallest // 4), smallest - most_shots)))


@dataclass(frozen=True)
class Cell:
    """One training run: ``arm`` (``real``, ``pool``, ``variants``, ``adapted`` or an extra's
    name), ``k`` real shots per label, ``seed``."""

    arm: str
    k: int
    seed: int

    @property
    def key(self) -> str:
        return f"{self.arm}/k{self.k}/s{self.seed}"


def cells(arms: Sequence[str], shots: Sequence[int], seeds: int) -> list[Cell]:
    """Every cell of a run, seed-major then ``k`` then arm: the first seeds of every arm and
    ``k`` finish first, so an interrupted run already pairs them."""
    return [Cell(arm, k, seed) for seed in range(seeds) for k in shots for arm in arms]


@dataclass(frozen=True)
class Split:
    """The fixed test split of a folder and the order shots are drawn in (module doc)."""

    test: np.ndarray  # indices into the data, label-major
    rest: dict[str, np.ndarray]  # per label, the indices shots come from (file order)

    @classmethod
    def of(cls, data: Images, *, test_per_label: int, most_shots: int) -> Split:
        """Cut the test split; a label with fewer than ``most_shots + test_per_label`` images
        is a :class:`GainInputError` naming it and its count."""
        short = [f"{name} ({data.count(name)})" for name in data.names
                 if data.count(name) < most_shots + test_per_label]
        if short:
            raise GainInputError(
                f"label(s) {', '.join(short)} hold(s) fewer images than {most_shots} shots + "
                f"{test_per_label} test images; give more images, fewer --shots, or a smaller "
                "--test-per-label")
        test: list[np.ndarray] = []
        rest: dict[str, np.ndarray] = {}
        for index, name in enumerate(data.names):
            mine = data.of(name)
            order = np.random.default_rng([SPLIT_SEED, index]).permutation(len(mine))
            test.append(np.sort(mine[order[:test_per_label]]))
            rest[name] = np.sort(mine[order[test_per_label:]])
        return cls(np.concatenate(test), rest)

    def shots(self, data: Images, k: int, seed: int) -> np.ndarray:
        """Seed ``seed``'s ``k`` shots per label (nested in ``k``), label-major."""
        chosen = []
        for index, name in enumerate(data.names):
            pool = self.rest[name]
            order = np.random.default_rng([seed, index, 7]).permutation(len(pool))
            chosen.append(pool[order[:k]])
        return np.concatenate(chosen)

    def test_files(self, data: Images) -> dict[str, list[str]]:
        """The test split as each label's file paths (the report records it)."""
        out: dict[str, list[str]] = {name: [] for name in data.names}
        for i in self.test:
            out[data.names[int(data.labels[i])]].append(data.files[int(i)])
        return out

    def validation(self, data: Images, k_max: int, per_label: int, seed: int) -> np.ndarray:
        """Up to ``per_label`` images per label that seed ``seed`` never trains on at any
        ``k`` up to ``k_max`` (the ones after its shots in its order): a validation split of
        the training side, never the test split."""
        if per_label < 1:
            raise GainInputError("a validation split needs at least one image per label")
        chosen = []
        for index, name in enumerate(data.names):
            pool = self.rest[name]
            order = np.random.default_rng([seed, index, 7]).permutation(len(pool))
            chosen.append(pool[order[k_max:k_max + per_label]])
        return np.concatenate(chosen)
