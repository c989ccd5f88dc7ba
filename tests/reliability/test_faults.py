"""Faults at CI size (see reliability/faults.py).

SIGKILL during a training run is covered by tests/trainer/reference/test_train.py ("service
killed mid-fit; feeder reconnects") and is not repeated here. The SIGKILL during pool filling
(two service processes, about 15 s) is marked ``slow``: ``make test-slow`` and CI run it.
"""

from __future__ import annotations

from typing import Any

import pytest
from _rows import assert_all_rows, assert_row

from reliability import faults
from reliability.result import CheckResult
from reliability.run import CI


@pytest.fixture(scope="module")
def killed() -> CheckResult:
    return faults.check_kill_during_fill(rounds=CI.kill_rounds)


@pytest.mark.slow  # two service processes (filling, killed, restarted)
def test_sigkill_during_pool_filling_keeps_the_database_intact(killed: CheckResult) -> None:
    assert_row(killed, "SIGKILL of the service while its pool fills")


@pytest.mark.slow  # two service processes (filling, killed, restarted)
def test_no_acknowledged_image_is_missing_after_sigkill(killed: CheckResult) -> None:
    assert_row(killed, "acknowledged images")
    assert killed.row("acknowledged images").tried > 0


@pytest.mark.slow  # two service processes (filling, killed, restarted)
def test_restart_after_sigkill_serves_the_same_pool(killed: CheckResult) -> None:
    assert_row(killed, "restart after the kill")


def test_generator_exception_fails_only_its_batch(tiny_model: Any) -> None:
    assert_all_rows(faults.check_generator_exception(tiny_model))


def test_generator_oom_halves_the_batch_and_a_lone_oom_fails_only_its_request(
    tiny_model: Any,
) -> None:
    result = faults.check_generator_oom(tiny_model)
    assert_all_rows(result)


def test_100_disconnected_requests_never_reach_the_pipeline(tiny_model: Any) -> None:
    result = faults.check_disconnects(tiny_model, count=CI.disconnects,
                                      rounds=CI.disconnect_rounds)
    assert_row(result, f"{CI.disconnects} queued requests whose clients disconnect")
    assert_row(result, "Python memory of the service process")


def test_slow_and_stalled_clients_do_not_hold_others(tiny_model: Any) -> None:
    result = faults.check_slow_clients(tiny_model, seconds=CI.slow_seconds)
    assert_all_rows(result)
