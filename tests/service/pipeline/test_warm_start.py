"""Ready in seconds: ``genaug serve`` with ``GENAUG_COMPILE=unet`` three times, as a user starts
it (a process each, a fresh ``TMPDIR`` each: torch's own caches empty), on the default model
with four batch sizes to warm.

1. Cold: ``/readyz`` says how far the warm-up is (``warming k of 4: ...``); the four batch
   sizes compile once (dynamo's count, ``genaug_compiles_total``); the UNet is built into an
   AOTInductor package; the entry is saved with it.
2. From the package: the same folder, another process: every shape ``packaged``, nothing
   traced (no dynamo graph), ``acceleration.unet_package`` says it was loaded.
3. From the cache only (``GENAUG_COMPILE_PACKAGE=false``): every shape ``from the cache`` or
   reused, nothing compiled by inductor.
4. A spoiled package (its file's bytes changed): the entry is skipped in one log line naming
   it, the service compiles as if there were none, serves, and saves a sound entry again.

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
import numpy as np
import pytest

from genaug.local_service import free_port
from genaug.wire import decode_batch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # four starts, ~3 min
SHAPES = "64x64:1,64x64:2,64x64:4,64x64:8"


def start(cache: Path, tmp: Path, name: str, **extra: str) -> dict[str, Any]:
    """One ``genaug serve`` to ready: the /readyz details seen on the way, /v1/info's speed
    group, /metrics, and its log; then Ctrl-C."""
    fresh = tmp / f"tmp-{name}"
    fresh.mkdir()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GENAUG_", "TORCH"))}
    env.update(TMPDIR=str(fresh), GENAUG_COMPILE="unet", GENAUG_COMPILE_CACHE=str(cache),
               GENAUG_WARMUP_SHAPES=SHAPES, GENAUG_TORCH_THREADS="1", PYTHONUNBUFFERED="1",
               **extra)
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
        drawn = httpx.post(url + "/v1/generate", json={"prompt": "a handwritten 3", "n": 2,
                                                       "seed": 7, "height": 64, "width": 64},
                           timeout=120)
        assert drawn.status_code == 200, drawn.text
        metrics = httpx.get(url + "/metrics", timeout=10).text
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(60)
    return {"details": details, "acceleration": acceleration, "metrics": metrics,
            "log": log.read_text(), "images": decode_batch(drawn.content).images}


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

    assert cold["acceleration"]["unet_package"] == "built 1 for the next start"
    (package,) = (entry / "files" / "unet-packages").glob("*.pt2")

    packaged = start(cache, tmp_path, "packaged")
    saved = cold["acceleration"]["compile_cache"]
    assert packaged["acceleration"]["compile_cache"] == {**saved, "state": "kept"}
    assert packaged["acceleration"]["unet_package"] == "loaded 1 package"
    assert metric(packaged["metrics"], "genaug_compiles_total") == 0  # nothing traced
    assert packaged["log"].count(", packaged") == 4 and ", compiled" not in packaged["log"]
    # The package draws what the compiled UNet drew (to a rounding of the last bit).
    difference = np.abs(packaged["images"].astype(int) - cold["images"].astype(int))
    assert difference.max() <= 1, difference.max()

    warm = start(cache, tmp_path, "warm", GENAUG_COMPILE_PACKAGE="false")
    assert warm["acceleration"]["compile_cache"] == {**saved, "state": "kept"}
    assert "64x64:1 (GENAUG_WARMUP_SHAPES): " in warm["log"]
    assert ", from the cache" in warm["log"] and ", compiled" not in warm["log"]
    assert all(not d.endswith(", compiling)") for d in warm["details"]), warm["details"]

    package.write_bytes(package.read_bytes()[: package.stat().st_size // 2])  # half a file
    spoiled = start(cache, tmp_path, "spoiled")
    said = [line for line in spoiled["log"].splitlines() if "compile cache entry" in line]
    assert len(said) == 1 and str(entry) in said[0] and "(spoiled)" in said[0], said
    assert "Traceback" not in spoiled["log"]
    assert spoiled["acceleration"]["compile_cache"]["state"].startswith("saved ")
    assert ", compiled" in spoiled["log"]
