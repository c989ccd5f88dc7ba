"""Assertion helpers shared by the reliability tests."""

from __future__ import annotations

from reliability.result import CheckResult


def assert_row(result: CheckResult, prefix: str) -> None:
    row = result.row(prefix)
    assert row.ok, f"{row.what}: held={row.held!r} lost={row.lost!r} details={row.details}"


def assert_all_rows(result: CheckResult) -> None:
    failures = result.failures()
    assert not failures, result.explain()
