"""Ready in seconds: ``genaug serve`` with ``GENAUG_COMPILE=unet`` three times, as a user starts
it (a process each, a fresh ``TMPDIR`` each: torch's own caches empty), on the default model
with four batch sizes to warm.

1. Cold: ``/readyz`` says how far the warm-up is (``warming k of 4: ...``); the four batch
   sizes compile once (dynamo's count, ``genaug_compiles_total``); the entry is saved.
2. From the cache: the same folder, another process: every shape ``from the cache`` or
   reused, nothing compiled by inductor.
3. A spoiled entry (one kernel file's bytes changed): skipped in one log line naming it, the
   service compiles as if there were none, serves, and saves a sound entry again.

How much faster the second start is, is measured by ``python -m bench.service.warm_start``
(docs/benchmarks.md), not asserted here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from genaug.local_service import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # three compiled starts, ~90 s
SHAPES = "64x64:1,64x64:2,64x64:4,64x64:8"


def start(cache: Path, tmp: Path, name: str) -> dict[str, Any]:
    """One ``genaug serve`` to ready: the /readyz details seen on the way, /v1/info's speed
    group, /metrics, and its log; then Ctrl-C."""
    fresh = tmp / f"tmp-{name}"
    fresh.mkdir()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GENAUG_", "TORCH"))}
    env.update(TMPDIR=str(fresh), GENAUG_COMPILE="unet", GENAUG_COMPILE_CACHE=str(cache),
               GENAUG_WARMUP_SHAPES=SHAPES, GENAUG_TORCH_THREADS="1", PYTHONUNBUFFERED="1")
    log = tmp / f"{name}.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "genaug.cli", "serve", "--port",
                                 str(port)], stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    details: list[str] = []
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            try:
                ready = httpx.get(url + "/readyz", timeout=5)
            except httpx.TransportError:
                time.sleep(0.1)
                continue
            if ready.status_code == 200:
                break
            details.append(ready.json()["detail"])
            time.sleep(0.05)
        acceleration = httpx.get(url + "/v1/info", timeout=10).json()["acceleration"]
        metrics = httpx.get(url + "/metrics", timeout=10).text
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(60)
    return {"details": details, "acceleration": acceleration, "metrics": metrics,
            "log": log.read_text()}


def metric(text: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in text.splitlines()
                if line.startswith(name + " "))


def test_a_cold_start_a_start_from_the_cache_and_a_spoiled_cache(tmp_path: Path) -> None:
    cache = tmp_path / "compile-cache"
    cold = start(cache, tmp_path, "cold")
    warming = [d for d in cold["details"] if d.startswith("warming ")]
    assert any(d.startswith("warming 1 of 4: 64x64 batch 1 (") and d.endswith(", compiling)")
               for d in warming), cold["details"]
    warmup = cold["acceleration"]["warmup"]
    assert warmup["finished"] and warmup["total"] == 4
    assert cold["acceleration"]["compile_cache"]["state"].startswith("saved ")
    assert 1 <= metric(cold["metrics"], "genaug_compiles_total") <= 2  # four batch sizes
    assert metric(cold["metrics"], "genaug_recompiles_total") == 0
    for n in (1, 2, 4, 8):
        assert f"64x64:{n} (GENAUG_WARMUP_SHAPES)" in cold["log"]
    assert "64x64:2 (GENAUG_WARMUP_SHAPES): " in cold["log"] and ", reused" in cold["log"]
    (entry,) = [p for p in cache.iterdir() if not p.name.startswith(".")]

    warm = start(cache, tmp_path, "warm")
    saved = cold["acceleration"]["compile_cache"]
    assert warm["acceleration"]["compile_cache"] == {**saved, "state": "kept"}
    assert "64x64:1 (GENAUG_WARMUP_SHAPES): " in warm["log"]
    assert ", from the cache" in warm["log"] and ", compiled" not in warm["log"]
    assert all(not d.endswith(", compiling)") for d in warm["details"]), warm["details"]

    kernel = max((p for p in (entry / "files").rglob("*") if p.is_file()),
                 key=lambda p: p.stat().st_size)
    kernel.write_bytes(kernel.read_bytes()[: kernel.stat().st_size // 2])  # half a file
    spoiled = start(cache, tmp_path, "spoiled")
    said = [line for line in spoiled["log"].splitlines() if "compile cache entry" in line]
    assert len(said) == 1 and str(entry) in said[0] and "(spoiled)" in said[0], said
    assert "Traceback" not in spoiled["log"]
    assert spoiled["acceleration"]["compile_cache"]["state"].startswith("saved ")
    assert ", compiled" in spoiled["log"]
