"""``kill -9`` of the service in the middle of an epoch: the epoch ends with no exception and
no step waits on the network, and fresh pool images flow again within 10 s of the restarted
service's ``/readyz`` turning 200 (the streams retry every 2 s at most)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from _torch_shapes import wait_for_pool
from torch.utils.data import DataLoader

from genaug.local_service import free_port, start_child, stop_child
from genaug.torch import PoolDataset

ROOT = Path(__file__).resolve().parents[2]


def _serve(port: int, pool: Path, log: Path) -> Any:
    env = {**os.environ, "GENAUG_LOG_LEVEL": "warning", "GENAUG_TORCH_THREADS": "1"}
    with open(log, "ab") as out:
        return start_child(
            [sys.executable, "-m", "genaug.cli", "serve", "--port", str(port), "--recipes",
             str(ROOT / "recipes" / "digits.yaml"), "--pool-path", str(pool),
             "--pool-capacity-per-label", "16"],
            env=env, stdout=out, stderr=out, start_new_session=True)


def _ready(url: str, timeout_s: float = 180.0) -> float:
    """When ``/readyz`` first answered 200 (time.monotonic())."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return time.monotonic()
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} not ready within {timeout_s} s")


@pytest.mark.slow
def test_a_killed_service_costs_no_step_and_its_return_brings_fresh_images(
        tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _serve(port, tmp_path / "pool.db", tmp_path / "serve.log")
    try:
        _ready(url)
        wait_for_pool(url, "digits", at_least=4, labels=10, timeout_s=300)
        pool = PoolDataset(url, "digits", length=1600, trainer_id="outage", seed=0)
        loader = DataLoader(pool, batch_size=16, num_workers=2, persistent_workers=True)
        waits: list[float] = []
        iterator = iter(loader)
        for step in range(100):
            started = time.monotonic()
            next(iterator)
            waits.append(time.monotonic() - started)
            if step == 20:
                os.killpg(proc.pid, signal.SIGKILL)  # kill -9 the service and its children
                proc.wait()
        with pytest.raises(StopIteration):
            next(iterator)  # the epoch ended by itself
        assert max(waits[1:]) < 1.0, waits  # the first step starts the workers
        time.sleep(3)
        assert pool.stats()["failures"] > 0  # the streams did see the service go
        received = pool.stats()["received"]
        proc = _serve(port, tmp_path / "pool.db", tmp_path / "serve.log")
        back = _ready(url)
        while pool.stats()["received"] <= received:
            assert time.monotonic() - back < 10.0, pool.stats()
            time.sleep(0.05)
        took = time.monotonic() - back
        sys.stderr.write(f"longest step wait {max(waits[1:]):.3f} s (of 99, 79 after the kill); "
                         f"fresh images {took:.1f} s after /readyz turned 200\n")
        assert len(list(loader)) == 100  # a second epoch on the same workers, after it all
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            stop_child(proc, grace_s=30)
