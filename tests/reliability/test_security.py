"""Authentication, secrets and secure defaults at CI size (see reliability/security.py)."""

from __future__ import annotations

from typing import Any

import pytest
from _rows import assert_row

from reliability import security
from reliability.result import CheckResult
from reliability.run import CI


@pytest.fixture(scope="module")
def auth(tiny_model: Any) -> CheckResult:
    return security.check_auth(tiny_model, timing_requests=CI.timing_requests)


@pytest.fixture(scope="module")
def defaults(tiny_model: Any) -> CheckResult:
    return security.check_secure_defaults(tiny_model)


def test_only_the_probes_are_open_when_keys_are_set(auth: CheckResult) -> None:
    assert_row(auth, "every operation of the schema")


def test_keys_never_appear_in_bodies_or_logs(auth: CheckResult) -> None:
    assert_row(auth, "keys never in response bodies")


def test_key_comparison_uses_compare_digest(auth: CheckResult) -> None:
    assert_row(auth, "timing-safe comparison")


def test_wrong_key_timing_does_not_depend_on_the_shared_prefix(auth: CheckResult) -> None:
    assert_row(auth, "wrong key sharing 63 of 64")


def test_every_status_answered_is_documented(auth: CheckResult) -> None:
    assert_row(auth, "statuses the service answered are documented")


def test_settings_default_to_loopback_and_no_cors(defaults: CheckResult) -> None:
    assert_row(defaults, "Settings() with no GENAUG_* variables")


def test_a_planted_malicious_pt_is_refused_and_never_runs(defaults: CheckResult) -> None:
    assert_row(defaults, "python -m genaug.service --unet-weights evil.pt")


def test_the_service_process_listens_on_loopback_only(defaults: CheckResult) -> None:
    assert_row(defaults, "child started without --host")


def test_no_cors_headers_unless_configured(defaults: CheckResult) -> None:
    assert_row(defaults, "CORS without configuration")
    assert_row(defaults, "GENAUG_CORS_ORIGINS=")


def test_requests_cannot_name_files(defaults: CheckResult) -> None:
    assert_row(defaults, "recipe names and static paths")
    assert_row(defaults, "no request field or parameter")
