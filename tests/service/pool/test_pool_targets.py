"""Targets and demand as pure functions of the counts and an injected ``now``."""

from __future__ import annotations

import pytest

from genaug.service.pool.targets import (
    DEMAND_HALF_LIFE_S,
    DemandBoard,
    asked_fill,
    fill_target,
    label_limit,
)


def test_a_label_of_real_images_is_limited_to_images_times_variants() -> None:
    assert label_limit(capacity=100, images=None, sources=0, variants_per_image=4) == 100
    assert label_limit(capacity=100, images="shots", sources=3, variants_per_image=4) == 12
    assert label_limit(capacity=10, images="shots", sources=3, variants_per_image=4) == 10


def test_the_target_is_what_was_asked_or_the_capacity_when_pregenerating_capped() -> None:
    assert asked_fill(own=5, shared=20, limit=100) == 20
    assert asked_fill(own=30, shared=20, limit=25) == 25
    assert fill_target(own=5, shared=20, limit=100, capacity=100, pregenerate=False) == 20
    assert fill_target(own=5, shared=20, limit=100, capacity=100, pregenerate=True) == 100
    # a label of 3 real images x 4 variants is never planned past 12, pre-generating or not
    assert fill_target(own=50, shared=0, limit=12, capacity=100, pregenerate=True) == 12


def test_demand_halves_every_half_life_on_the_clock_it_is_given() -> None:
    board = DemandBoard()
    t0 = 1_000.0
    board.add("shapes", ["circle", "square"], 8.0, now=t0)
    board.add("shapes", ["circle"], 8.0, now=t0 + DEMAND_HALF_LIFE_S)  # 4 left, plus 8
    got = board.current("shapes", ["circle", "square", "triangle"],
                        now=t0 + 2 * DEMAND_HALF_LIFE_S)
    assert got == pytest.approx({"circle": 6.0, "square": 2.0, "triangle": 0.0})
    assert board.current("other", ["circle"], now=t0) == {"circle": 0.0}
