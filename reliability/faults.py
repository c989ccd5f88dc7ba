"""Faults: SIGKILL while pools fill, failures and out-of-memory inside the generator,
clients that disconnect, clients that are slow or stall.

Faults are injected from outside the product: a SIGKILL of the child process, and worker
wrappers handed to ``create_app(wrap_worker=...)`` (the same hook the tests use); nothing
here relies on a switch in the service.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import tempfile
import threading
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from genaug.service.testing import LiveService, start_service

from .harness import LogCapture, child_service
from .result import CheckResult, ms, percentile

RECIPE = """
recipes:
  - name: shapes
    height: 32
    width: 32
    steps: 2
    guidance: 3.0
    base_seed: 7
    labels:
      circle: {prompts: ["a circle"]}
      square: {prompts: ["a square"]}
"""

SMALL = {"height": 32, "width": 32, "steps": 2}


def _post(url: str, body: dict[str, Any], *, timeout: float = 30,
          path: str = "/v1/generate") -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=timeout)


# -- (a) SIGKILL during pool filling --------------------------------------------------------


def check_kill_during_fill(*, rounds: int = 1, workdir: Path | None = None) -> CheckResult:
    """Per round: a child service fills its pool while a client samples from it; SIGKILL;
    then the database must pass ``integrity_check``, hold every seed the client was sent,
    keep counters and rows consistent, and serve again after a restart."""
    from genaug.service.pool.open import open_pool
    from genaug.wire import decode_batch

    result = CheckResult("Faults", "kill_during_fill")
    started = time.monotonic()
    capacity = 100_000  # nothing is evicted: every acknowledged image must still be there
    acked: set[int] = set()
    problems: list[str] = []
    integrity: list[str] = []
    consistent = True
    restarted_ok = 0
    kills = 0
    in_flight_lost = 0
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmpdir = Path(tmp)
        (tmpdir / "recipes.yaml").write_text(RECIPE)
        db = tmpdir / "pool.db"
        args = ["--recipes", str(tmpdir / "recipes.yaml"), "--pool-path", str(db),
                "--pool-capacity-per-label", str(capacity), "--max-batch-images", "4",
                "--log-level", "warning"]
        for round_index in range(rounds):
            stop = threading.Event()
            round_acked: set[int] = set()

            def sampler(url: str, acked_here: set[int] = round_acked,
                        stop_event: threading.Event = stop) -> None:
                nonlocal in_flight_lost
                with httpx.Client(base_url=url, timeout=10) as client:
                    for _ in range(10_000):
                        if stop_event.is_set():
                            return
                        try:
                            r = client.post("/v1/recipes/shapes/sample", json={"n": 4})
                        except httpx.HTTPError:
                            in_flight_lost += 1  # killed mid-call: never acknowledged
                            return
                        if r.status_code == 200:
                            acked_here.update(decode_batch(r.content).seeds.tolist())
                        time.sleep(0.02)

            with child_service(args, log_path=tmpdir / f"fill-{round_index}.log") as child:
                thread = threading.Thread(target=sampler, args=(child.url,), daemon=True)
                thread.start()
                deadline = time.monotonic() + 60
                want = 12 * (round_index + 1)
                while time.monotonic() < deadline:
                    detail = httpx.get(child.url + "/v1/recipes/shapes", timeout=10).json()
                    if len(round_acked) >= 8 and detail["totals"]["generated"] >= want:
                        break
                    time.sleep(0.05)
                child.kill()  # mid-filling: the worker is writing batch after batch
                kills += 1
                stop.set()
                thread.join(timeout=15)
            acked |= round_acked
            store = open_pool(db, capacity_per_label=capacity)
            try:
                integrity.append(store.integrity_check())
                (pool,) = store.reads.pools()
                stats = store.stats(pool)
                for label, s in stats.items():
                    if s.fill != s.generated:
                        consistent = False
                        problems.append(f"round {round_index}: {label} fill {s.fill} != "
                                        f"generated {s.generated}")
                    if s.fill % 4:  # --max-batch-images 4: a batch is stored whole or not
                        consistent = False
                        problems.append(f"round {round_index}: {label} holds {s.fill} "
                                        "images, not whole batches of 4")
                stored = {seed for _, seed, _ in store.reads.iter_images(pool)}
                fills = {label: s.fill for label, s in stats.items()}
            finally:
                store.close()
            missing = acked - stored
            if missing:
                problems.append(f"round {round_index}: {len(missing)} acknowledged seeds missing")
            # Restart without pre-generation: the same pool, the same counts, it serves.
            with child_service([*args, "--pregenerate", "false"],
                               log_path=tmpdir / f"restart-{round_index}.log") as child:
                detail = httpx.get(child.url + "/v1/recipes/shapes", timeout=10).json()
                r = httpx.post(child.url + "/v1/recipes/shapes/sample", json={"n": 8},
                               timeout=30)
                served = set(decode_batch(r.content).seeds.tolist()) if r.status_code == 200 \
                    else set()
                if detail["pool_id"] == pool and detail["fill"] == fills and served \
                        and served <= stored:
                    restarted_ok += 1
                else:
                    problems.append(f"round {round_index}: after restart fill {detail['fill']} "
                                    f"!= {fills} or sample {r.status_code}")
        result.seconds = time.monotonic() - started
    missing_total = len(acked - stored) if rounds else 0
    result.add("SIGKILL of the service while its pool fills and a client samples", kills,
               f"integrity_check {sorted(set(integrity))}; rows == counters: {consistent}",
               ok=kills == rounds and set(integrity) == {"ok"} and consistent,
               problems=problems[:5])
    result.add("acknowledged images (seeds a client received before the kill) still in the "
               "pool", len(acked), f"{len(acked) - missing_total} of {len(acked)} present",
               lost=f"{missing_total} images", ok=missing_total == 0 and len(acked) > 0)
    result.add("restart after the kill: same pool id, same fill, samples served", rounds,
               f"{restarted_ok} of {rounds} restarts", ok=restarted_ok == rounds,
               in_flight_calls_cut=in_flight_lost)
    return result


def training_reference() -> CheckResult:
    """SIGKILL during a training run is covered by the trainer tests; this row points there."""
    result = CheckResult("Faults", "kill_during_training")
    path = Path(__file__).resolve().parents[1] / "tests/trainer/reference/test_train.py"
    where = ("tests/trainer/reference/test_train.py::"
             "test_service_killed_mid_fit_training_continues_and_feeder_reconnects")
    result.add("SIGKILL of the service during a training run", "see trainer tests",
               f"covered by {where}" + ("" if path.exists() else " — not in this checkout yet"),
               lost="see that test", ok=True, reference=True)
    return result


# -- (c) exceptions and out-of-memory inside the generator -----------------------------------


class RaiseOnMarker:
    """Worker wrapper: a batch holding an item whose prompt contains ``marker`` raises."""

    def __init__(self, inner: Any, marker: str = "boom") -> None:
        self.inner = inner
        self.marker = marker
        self.raised = 0

    def run(self, key: Any, items: Any, flight: Any = None) -> Any:
        if any(self.marker in item.prompt for item in items):
            self.raised += 1
            raise RuntimeError(f"injected failure #{self.raised} for a batch of {len(items)}")
        return self.inner.run(key, items, flight)


class OOMSampler:
    """Stands in front of the worker's sampler (the per-image-guidance denoising loop): raises
    ``torch.OutOfMemoryError`` for calls of more than ``max_images`` items, and for any call
    holding an ``always`` prompt, as a device that cannot fit the batch's activations would."""

    def __init__(self, inner: Any, *, max_images: int = 2, always: str = "huge") -> None:
        self.inner = inner
        self.max_images = max_images
        self.always = always
        self.calls: list[int] = []
        self.ooms = 0

    def denoise(self, key: Any, items: Any) -> Any:
        self._check(items)
        return self.inner.denoise(key, items)

    def start(self, key: Any, items: Any) -> Any:
        """The stepped loop the service runs (it can pause and cut between steps)."""
        self._check(items)
        return self.inner.start(key, items)

    def _check(self, items: Any) -> None:
        import torch

        self.calls.append(len(items))
        if len(items) > self.max_images or any(self.always in it.prompt for it in items):
            self.ooms += 1
            raise torch.OutOfMemoryError(
                f"CUDA out of memory (injected for a batch of {len(items)})")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _hold_and_send(live: LiveService, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    """Hold the worker, queue ``bodies`` concurrently so they share batches, release."""
    assert live.worker is not None
    live.worker.gate.clear()
    live.worker.entered.clear()
    try:
        with ThreadPoolExecutor(len(bodies) + 1) as pool:
            blocker = pool.submit(_post, live.url, {"prompt": "blocker", **SMALL, "seed": 1})
            live.worker.entered.wait(10)
            futures = [pool.submit(_post, live.url, b) for b in bodies]
            deadline = time.monotonic() + 10
            want = sum(b.get("n", 1) for b in bodies)
            while live.state.batcher.queued_images < want and time.monotonic() < deadline:
                time.sleep(0.02)
            live.worker.gate.set()
            blocker.result(timeout=60)
            return [f.result(timeout=60) for f in futures]
    finally:
        live.worker.gate.set()


def check_generator_exception(model: Any) -> CheckResult:
    """An exception in one batch fails only that batch's requests (503 + error id in the
    log); another batch in flight at the same time and the next batch succeed."""
    result = CheckResult("Faults", "generator_exception")
    started = time.monotonic()
    with LogCapture(["genaug.service.batching.batcher"], level=logging.ERROR) as logs, \
            start_service(model, wrap=RaiseOnMarker, max_batch_images=8, max_wait_ms=20) as live:
        failing = [{"prompt": "boom" if i == 0 else f"mate {i}", **SMALL, "seed": i}
                   for i in range(3)]
        other = [{"prompt": f"other {i}", "height": 64, "width": 64, "steps": 2, "seed": i}
                 for i in range(3)]
        responses = _hold_and_send(live, failing + other)
        bad, good = responses[:3], responses[3:]
        ids = set()
        clear = True
        for r in bad:
            if r.status_code != 503:
                clear = False
                continue
            error = r.json()["error"]
            ids.add(error.get("id"))
            clear &= error["type"] == "generation_failed" and "error id" in error["message"]
        in_log = all(i and i in logs.text for i in ids)
        after = _post(live.url, {"prompt": "after the failure", **SMALL, "seed": 9})
        result.add("RuntimeError raised in the generator for one batch of 3 requests", 3,
                   f"{sum(r.status_code == 503 for r in bad)} x 503 generation_failed with one "
                   f"error id {sorted(i for i in ids if i)}; found in the batcher log: {in_log}",
                   lost="the failed batch only",
                   ok=all(r.status_code == 503 for r in bad) and len(ids) == 1 and in_log
                   and clear)
        result.add("requests of another batch queued at the same time", len(good),
                   f"{sum(r.status_code == 200 for r in good)} x 200",
                   ok=all(r.status_code == 200 for r in good))
        result.add("the next batch after the failure", 1, f"status {after.status_code}",
                   ok=after.status_code == 200)
        five_hundreds = live.metric("genaug_batch_failures_total", 'reason="RuntimeError"')
        result.figures["batch_failures"] = five_hundreds
    result.seconds = time.monotonic() - started
    return result


def check_generator_oom(model: Any) -> CheckResult:
    """``torch.OutOfMemoryError`` for batches over 2 images: the Generator halves the batch
    until it fits and every request succeeds with the same images as alone; a single image
    that still runs out of memory fails only its own request."""
    result = CheckResult("Faults", "generator_oom")
    started = time.monotonic()
    holder: dict[str, OOMSampler] = {}

    def wrap(generator: Any) -> Any:
        holder["pipe"] = generator.sampler = OOMSampler(generator.sampler)
        return generator

    with LogCapture(["genaug.service"], level=logging.WARNING) as logs, \
            start_service(model, wrap=wrap, max_batch_images=8, max_wait_ms=20) as live:
        pipe = holder["pipe"]
        from genaug.wire import decode_batch

        bodies = [{"prompt": f"oom {i}", **SMALL, "n": 2, "seed": 10 * i} for i in range(4)]
        calls_before = len(pipe.calls)
        responses = _hold_and_send(live, bodies)
        calls = pipe.calls[calls_before:]
        same = True
        for body, r in zip(bodies, responses, strict=True):
            if r.status_code != 200:
                same = False
                continue
            batch = decode_batch(r.content)
            alone = decode_batch(_post(live.url, {**body, "n": 1}).content)
            same &= bool(np.array_equal(batch.images[0], alone.images[0]))
        result.add("out-of-memory for every pipeline call over 2 images (a batch of 8)",
                   len(bodies),
                   f"{sum(r.status_code == 200 for r in responses)} x 200 after halving; "
                   f"pipeline calls {calls}; images equal to the same seeds alone: {same}",
                   lost="nothing",
                   ok=all(r.status_code == 200 for r in responses) and same
                   and max(calls) > 2 and calls[-1] <= 2 and "retrying as" in logs.text)
        mixed = [{"prompt": "huge", **SMALL, "seed": 5}] + [
            {"prompt": f"fine {i}", **SMALL, "seed": 20 + i} for i in range(2)]
        responses = _hold_and_send(live, mixed)
        huge, fine = responses[0], responses[1:]
        error = huge.json().get("error", {}) if huge.status_code != 200 else {}
        result.add("a single image that still runs out of memory, batched with 2 others", 3,
                   f"its request {huge.status_code} {error.get('type')} (id {error.get('id')}); "
                   f"the others {[r.status_code for r in fine]}",
                   lost="that one request only",
                   ok=huge.status_code == 503 and bool(error.get("id"))
                   and "out of memory" in error.get("message", "")
                   and error.get("id", "-") in logs.text
                   and all(r.status_code == 200 for r in fine))
    result.seconds = time.monotonic() - started
    return result


# -- (d) queued requests whose clients disconnect --------------------------------------------


def check_disconnects(model: Any, *, count: int = 100, rounds: int = 1) -> CheckResult:
    """``count`` requests queue behind a held worker and their clients go away: none reaches
    the pipeline, the metric counts them, and the service's Python memory returns.

    A first round of 50 warms the server's thread pool (it grows once, to 40 threads, and
    keeps them), then ``rounds`` rounds of ``count`` are measured with tracemalloc.
    """
    result = CheckResult("Faults", "disconnects")
    started = time.monotonic()
    metric, labels = "genaug_dropped_before_pipeline_total", 'reason="disconnected"'
    with start_service(model, max_batch_images=8, max_wait_ms=0, max_queue_images=4096) as live:
        assert live.worker is not None
        url = live.url
        warm = 50
        _post(url, {"prompt": "warm", **SMALL, "seed": 0})
        asyncio.run(_disconnecting(url, warm, prefix="warm-gone", hold=live))
        expected = _wait_metric(live, metric, labels, warm)
        _post(url, {"prompt": "warm again", **SMALL, "seed": 0})
        deltas: list[int] = []
        dropped = 0.0
        statuses = []
        gc.collect()
        tracemalloc.start()
        try:
            for _ in range(rounds):
                gc.collect()
                before = tracemalloc.get_traced_memory()[0]
                asyncio.run(_disconnecting(url, count, prefix="gone", hold=live))
                now = _wait_metric(live, metric, labels, expected + count)
                dropped += now - expected
                expected = now
                statuses.append(_post(url, {"prompt": "after", **SMALL, "seed": 3}).status_code)
                gc.collect()
                deltas.append(tracemalloc.get_traced_memory()[0] - before)
        finally:
            tracemalloc.stop()
        leaked = [p for p in live.worker.prompts if p.startswith("gone ")]
        batcher = live.state.batcher
        queued = batcher.queued_images
        queues_empty = batcher.queue.requests == 0
        total = count * rounds
        result.add(f"{count} queued requests whose clients disconnect (worker held)"
                   + (f", {rounds} rounds" if rounds > 1 else ""), total,
                   f"genaug_dropped_before_pipeline_total{{reason=\"disconnected\"}} += "
                   f"{dropped:.0f}; pipeline saw {len(leaked)} of them; next requests "
                   f"{sorted(set(statuses))}",
                   lost="nothing",
                   ok=dropped == total and not leaked and set(statuses) == {200})
        limit = 256 * 1024
        result.add("Python memory of the service process after each round (tracemalloc)",
                   rounds,
                   "traced delta per round " + ", ".join(f"{d / 1024:+.0f} KiB" for d in deltas)
                   + f" (limit +{limit // 1024} KiB); queue {queued} images, queues empty: "
                   f"{queues_empty}",
                   ok=max(deltas) < limit and queued == 0 and queues_empty, deltas=deltas)
    result.seconds = time.monotonic() - started
    return result


def _wait_metric(
    live: LiveService, name: str, labels: str, target: float, timeout: float = 30
) -> float:
    deadline = time.monotonic() + timeout
    value = live.metric(name, labels)
    while value < target and time.monotonic() < deadline:
        time.sleep(0.05)
        value = live.metric(name, labels)
    return float(value)


async def _disconnecting(url: str, count: int, *, prefix: str, hold: LiveService) -> None:
    """Hold the worker on a blocker, send ``count`` requests that time out client-side (the
    client closes its connection), wait until the service has dropped them, release."""
    assert hold.worker is not None
    hold.worker.gate.clear()
    hold.worker.entered.clear()
    loop = asyncio.get_running_loop()
    blocker = loop.run_in_executor(None, lambda: _post(url, {"prompt": "blocker", **SMALL}))
    try:
        await loop.run_in_executor(None, hold.worker.entered.wait, 10)
        limits = httpx.Limits(max_connections=count + 10)
        async with httpx.AsyncClient(base_url=url, timeout=1.5, limits=limits) as client:

            async def one(i: int) -> None:
                try:
                    await client.post("/v1/generate", json={"prompt": f"{prefix} {i}", **SMALL})
                except httpx.TimeoutException:
                    pass

            await asyncio.gather(*(one(i) for i in range(count)))
        # Let the service notice every disconnect before the worker is released.
        deadline = time.monotonic() + 20
        while hold.state.batcher.queued_images and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        hold.worker.gate.set()
    await blocker


# -- (e) slow and stalled clients ------------------------------------------------------------


def check_slow_clients(model: Any, *, slow: int = 4, stalled_readers: int = 2,
                       seconds: float = 4.0) -> CheckResult:
    """Clients that send their body a byte at a time, or never read a large response, while
    normal clients keep generating: the normal clients' requests all complete, with latency
    close to a run without them."""
    result = CheckResult("Faults", "slow_clients")
    started = time.monotonic()
    with start_service(model, record=False, max_batch_images=8, max_wait_ms=10,
                       max_queue_images=1024, max_n=64) as live:
        url = live.url
        baseline = _normal_traffic(url, seconds=seconds / 2)
        sockets: list[socket.socket] = []
        stop = threading.Event()
        trickled = [0]

        def trickle(sock: socket.socket, body: bytes) -> None:
            for i in range(len(body)):
                if stop.is_set():
                    return
                try:
                    sock.sendall(body[i : i + 1])
                except OSError:
                    return
                trickled[0] += 1
                time.sleep(0.05)

        threads = []
        try:
            body = b'{"prompt": "slow loris", "height": 32, "width": 32, "steps": 2}'
            for _ in range(slow):
                sock = socket.create_connection(("127.0.0.1", live.settings.port), timeout=5)
                sockets.append(sock)
                sock.sendall(b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Type: "
                             b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
                t = threading.Thread(target=trickle, args=(sock, body), daemon=True)
                t.start()
                threads.append(t)
            # Stalled readers: ask for a large output and never read the socket.
            big = (b'{"prompt": "never read", "n": 4, "height": 32, "width": 32, '
                   b'"output_height": 1024, "output_width": 1024, "steps": 1}')
            for _ in range(stalled_readers):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.settimeout(5)
                sock.connect(("127.0.0.1", live.settings.port))
                sockets.append(sock)
                sock.sendall(b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nX-Client-Id: stalled\r\n"
                             b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(big), big))
            time.sleep(0.3)
            during = _normal_traffic(url, seconds=seconds)
            generated_big = live.metric("genaug_images_generated_total", 'source="request"')
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=5)
            for sock in sockets:
                sock.close()
    base_p50 = percentile(baseline["latency"], 50)
    p50 = percentile(during["latency"], 50)
    p99 = percentile(during["latency"], 99)
    result.add(f"{slow} clients sending a body one byte per 50 ms and {stalled_readers} that "
               "never read a 12 MB response, while 4 normal clients generate", during["sent"],
               f"normal requests {during['ok']} of {during['sent']} x 200; p50 {ms(p50)} "
               f"(without the slow clients {ms(base_p50)}), p99 {ms(p99)}; "
               f"{trickled[0]} bytes trickled",
               lost=f"{during['sent'] - during['ok']} requests",
               ok=during["sent"] > 0 and during["ok"] == during["sent"]
               and p99 < 10.0 and p50 < max(1.0, 5 * base_p50),
               generated_images=generated_big)
    result.seconds = time.monotonic() - started
    return result


def _normal_traffic(url: str, *, seconds: float, clients: int = 4) -> dict[str, Any]:
    latency: list[float] = []
    statuses: list[int | None] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def loop(index: int) -> None:
        with httpx.Client(base_url=url, timeout=20,
                          headers={"X-Client-Id": f"normal-{index}"}) as client:
            for i in range(10_000):
                if time.monotonic() >= stop_at:
                    return
                t0 = time.monotonic()
                try:
                    status: int | None = client.post(
                        "/v1/generate", json={"prompt": f"normal {index}.{i}", **SMALL}
                    ).status_code
                except httpx.HTTPError:
                    status = None
                with lock:
                    statuses.append(status)
                    latency.append(time.monotonic() - t0)

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + 30)
    return {"sent": len(statuses), "ok": statuses.count(200), "latency": latency}
