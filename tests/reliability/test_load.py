"""Load at CI size: 8 clients for 10 s against a child service (see reliability/load.py).

Marked ``slow`` (about 20 s with the child's start-up): ``make test-slow`` and CI run it.
"""

from __future__ import annotations

import pytest
from _rows import assert_row

from reliability.load import MAX_QUEUE, check_load
from reliability.result import CheckResult
from reliability.run import CI

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def load() -> CheckResult:
    return check_load(clients=CI.load_clients, seconds=CI.load_seconds)


def test_every_request_is_answered_none_lost_none_hanging(load: CheckResult) -> None:
    assert_row(load, f"{CI.load_clients} clients")
    by_status = load.figures["by_status"]
    assert set(by_status) <= {200, 429, 504}, by_status
    assert load.figures["sent"] == sum(by_status.values())


def test_no_server_errors(load: CheckResult) -> None:
    assert_row(load, "no 5xx")


def test_queue_full_and_deadline_paths_were_exercised(load: CheckResult) -> None:
    assert_row(load, "429 and 504 paths exercised")


def test_queue_depth_never_exceeds_its_bound(load: CheckResult) -> None:
    assert_row(load, "queue depth")
    assert load.figures["max_depth"] <= MAX_QUEUE


def test_service_memory_after_warmup_grows_less_than_10_percent(load: CheckResult) -> None:
    assert_row(load, "service RSS")
    assert load.figures["growth"] < 0.10


def test_latency_table_has_every_kind(load: CheckResult) -> None:
    (table,) = load.tables
    assert [row[0] for row in table.rows] == ["generate interactive", "generate bulk",
                                              "generate tiny timeout", "pool sample"]
    assert all(row[1] > 0 for row in table.rows), table.rows


def test_binds_loopback_by_default(load: CheckResult) -> None:
    assert load.figures["bind"] == ["127.0.0.1"]
