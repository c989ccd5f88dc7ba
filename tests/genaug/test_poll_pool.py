"""``poll_pool``, the one pool wait of the demo, the few-shot runs and the benchmarks: it
ends when the pool is filled, at once when the judge stopped a label the wait needs, and
with a ``TimeoutError`` naming the fill otherwise. The details are shaped as
``GET /v1/recipes/{name}`` answers them (the live wait is in
tests/service/pool/test_pool_stopped.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from genaug.experiments.fewshot import PoolStoppedError, poll_pool

REASON = ("stopped: the judge accepted 2 of the 50 images of label 'square' (under 10 %); "
          "fix the prompts of 'square' or lower the recipe's judge threshold")


def _detail(fill: dict[str, int], stopped: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": "shapes", "labels": ["circle", "square"], "fill": fill,
            "stopped": stopped or {}, "totals": {"generated": sum(fill.values())}}


def _answers(*details: dict[str, Any]) -> tuple[Callable[[], dict[str, Any]], list[int]]:
    """A fetch that answers ``details`` in turn (the last one again), counting its calls."""
    calls: list[int] = []
    it: Iterator[dict[str, Any]] = iter(details)

    def fetch() -> dict[str, Any]:
        calls.append(1)
        return next(it, details[-1])

    return fetch, calls


def test_it_returns_once_every_label_holds_per_label() -> None:
    # a label the service has not stored yet is absent from ``fill``: it holds 0
    fetch, calls = _answers(_detail({"circle": 9}), _detail({"circle": 9, "square": 3}),
                            _detail({"circle": 9, "square": 8}))
    detail = poll_pool(fetch, per_label=8, timeout=10, poll_s=0.001)
    assert detail["fill"] == {"circle": 9, "square": 8} and len(calls) == 3


def test_a_label_stopped_short_ends_the_wait_at_once_with_the_judges_reason() -> None:
    fetch, calls = _answers(_detail({"circle": 9, "square": 2}, {"square": REASON}))
    with pytest.raises(PoolStoppedError) as raised:
        poll_pool(fetch, per_label=8, timeout=60, poll_s=0.001)
    assert len(calls) == 1
    assert raised.value.stopped == {"square": REASON}
    assert str(raised.value).startswith("recipe 'shapes': the judge stopped 1 label(s) short "
                                        "of 8 images (square 2 held)")


def test_only_the_labels_waited_for_count() -> None:
    # square is stopped, but this wait is for circle only: it fills and returns
    fetch, _ = _answers(_detail({"circle": 3, "square": 2}, {"square": REASON}),
                        _detail({"circle": 8, "square": 2}, {"square": REASON}))
    detail = poll_pool(fetch, per_label=8, labels=["circle"], timeout=10, poll_s=0.001)
    assert detail["fill"]["circle"] == 8


def test_a_condition_of_its_own_with_no_per_label_stops_on_any_stopped_label() -> None:
    fetch, _ = _answers(_detail({"circle": 40, "square": 2}, {"square": REASON}))
    with pytest.raises(PoolStoppedError, match="square"):
        poll_pool(fetch, per_label=None, timeout=60, poll_s=0.001,
                  filled=lambda detail: detail["totals"]["generated"] >= 100)


def test_the_timeout_names_the_recipe_and_its_fill() -> None:
    fetch, calls = _answers(_detail({"circle": 1, "square": 1}))
    with pytest.raises(TimeoutError, match=r"pool of recipe 'shapes' holds \{'circle': 1, "
                                           r"'square': 1\} after 0 s; wanted 8 images"):
        poll_pool(fetch, per_label=8, timeout=0.05, poll_s=0.01)
    assert len(calls) >= 2
