"""python -m bench.service.webhook_overhead --quick runs end to end (CI size), on the real path.

A child process, as ``python -m`` runs it: the in-process service with the tiny model under
uvicorn, started with ``webhook_hosts`` naming a receiver that never answers and a secret;
before each webhooks phase, fill jobs with ``notify_url`` end ``done`` and the app's job loop
hands their webhooks to its sender. The figures here are not the benchmark's (2 rounds on a
shared machine): the test checks that every webhooks phase really had its jobs' webhooks
hanging in the job loop's sender (the app's own in the shipped phase), retrying in the stress
phase, while generation was measured; and that afterwards each job's signed body reached the
receiver and the pool recorded its webhook delivered (what only the job loop writes).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # a service start and 6 measured phases: ~25-45 s on 2 busy cores


@pytest.mark.timeout(600)
def test_quick_benchmark_measures_generation_beside_real_jobs_hanging_webhooks(
        tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.service.webhook_overhead", "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=540, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["benchmark"] == "webhook_overhead" and result["deliveries"] == 16
    for phase in ("none", "shipped", "stress"):
        assert len(result["images_s"][phase]) == result["rounds"] == 2
        assert all(rate > 0 for rate in result["images_s"][phase])
    # The shipped phases counted the app's own sender (state.job_loop.sender as the lifespan
    # made it); the stress phases the job loop's swapped-in one.
    for arm, sender, in_flight in (("shipped", "app", 8), ("stress", "own", 16)):
        phases = result["phases"][arm]
        assert len(phases) == 2
        assert all(p["sender"] == sender for p in phases), phases
        # measured with all 16 jobs' webhooks pending, attempts in flight, none ended
        assert all(p["pending"] == 16 and p["delivered"] == p["failed"] == 0
                   for p in phases), phases
        assert all(p["in_flight_steady"] == in_flight for p in phases), phases
        # the deliveries were those of the 16 fill jobs: each job's signed body arrived, the
        # sender delivered 16 once answered, and the pool recorded each job's webhook
        assert all(p["jobs"] == p["received"] == p["delivered_after"] == p["recorded"] == 16
                   for p in phases), phases
    assert result["bad_signatures"] == 0
    # the stress phase churned: its 1 s attempts timed out and were retried before measuring
    assert all(p["retries"] >= 16 for p in result["phases"]["stress"]), result["phases"]
    assert 0 < result["ratio_shipped"] and 0 < result["ratio_stress"]
    assert "shipped: 16 jobs' webhooks in the app's sender, 8 in flight" in proc.stdout
    assert result["met"] == (result["ratio_shipped"] >= 0.95)
