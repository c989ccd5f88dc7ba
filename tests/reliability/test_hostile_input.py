"""Hostile input at CI size: schemathesis over /openapi.json, body limits, malformed bodies
(see reliability/hostile.py)."""

from __future__ import annotations

from typing import Any

import pytest
from _rows import assert_row

from reliability import hostile
from reliability.result import CheckResult
from reliability.run import CI

pytest.importorskip("schemathesis")


@pytest.fixture(scope="module")
def fuzz(tiny_model: Any) -> CheckResult:
    return hostile.check_fuzz(tiny_model, examples=CI.fuzz_examples)


@pytest.fixture(scope="module")
def limits(tiny_model: Any) -> CheckResult:
    return hostile.check_size_limits(tiny_model)


@pytest.fixture(scope="module")
def malformed(tiny_model: Any) -> CheckResult:
    return hostile.check_malformed(tiny_model)


def test_schemathesis_checks_all_find_nothing_without_keys(fuzz: CheckResult) -> None:
    assert_row(fuzz, "schemathesis --checks all (open)")


def test_schemathesis_checks_all_find_nothing_with_api_keys(fuzz: CheckResult) -> None:
    assert_row(fuzz, "schemathesis --checks all (with API keys)")


def test_fuzzing_reaches_every_json_operation_and_each_recipe_path(fuzz: CheckResult) -> None:
    ops = fuzz.figures["per_operation"]
    for needed in ("POST /v1/generate", "POST /v1/recipes/shapes/sample",
                   "POST /v1/recipes/shapes/fill", "POST /v1/recipes/shapes/feedback",
                   "POST /v1/recipes/shapes/verdicts", "GET /v1/recipes/shapes/images",
                   "GET /v1/recipes/shapes", "GET /v1/info"):
        assert any(needed in name for name in ops), (needed, sorted(ops))


def test_declared_length_over_the_limit_is_413_before_any_body(limits: CheckResult) -> None:
    assert_row(limits, "Content-Length 1 GB")


def test_chunked_body_over_the_limit_is_refused_and_cut_short(limits: CheckResult) -> None:
    assert_row(limits, "chunked body over the limit")


def test_chunked_body_over_the_limit_is_413(limits: CheckResult) -> None:
    assert_row(limits, "chunked body without Content-Length")


def test_100000_levels_of_nesting_are_refused_by_size(limits: CheckResult) -> None:
    assert_row(limits, "100000 nested JSON arrays")


def test_nan_infinities_and_extreme_integers_are_clear_4xx(malformed: CheckResult) -> None:
    assert_row(malformed, "NaN, infinities")


def test_unparseable_bodies_are_4xx_never_5xx(malformed: CheckResult) -> None:
    assert_row(malformed, "unparseable bodies (")


def test_unparseable_bodies_get_a_message_that_says_why(malformed: CheckResult) -> None:
    assert_row(malformed, "unparseable bodies: the message")
