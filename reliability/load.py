"""Load: concurrent clients mixing direct generation, pool samples, priorities, deadlines.

The service runs as a child process (``python -m genaug.service``) so its memory is its own:
RSS is read from /proc after a warm-up phase and at the end. A small ``max_queue_images``
makes 429s happen and the shortest ``timeout_s`` (0.5 s) on a request that takes longer than
that to generate (150 steps) makes 504s happen; every request must come back as images, a
429 with ``Retry-After`` or a 504, within a hard client-side timeout.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from genaug.service.testing import read_metric

from .faults import RECIPE  # the checks' one tiny recipe: shapes, two labels
from .harness import child_service, listen_addresses, rss_bytes
from .result import CheckResult, Table, ms, percentile

MAX_QUEUE = 12
HARD_TIMEOUT_S = 30.0  # per request, client side: an answer later than this is "hanging"

# kind -> (path, body)
KINDS: dict[str, tuple[str, dict[str, Any]]] = {
    "generate interactive": ("/v1/generate", {"prompt": "interactive", "n": 2, "height": 32,
                                              "width": 32, "steps": 2}),
    "generate bulk": ("/v1/generate", {"prompt": "bulk", "n": 6, "height": 32, "width": 32,
                                       "steps": 2, "priority": "bulk"}),
    # 150 steps (the default max_steps) take over a second on the tiny pipeline even alone,
    # so this deadline is missed by construction, not only when the queue happens to be slow.
    "generate tiny timeout": ("/v1/generate", {"prompt": "impatient", "n": 2, "height": 32,
                                               "width": 32, "steps": 150, "timeout_s": 0.5}),
    "pool sample": ("/v1/recipes/shapes/sample", {"n": 4}),
}


@dataclass
class Outcome:
    kind: str
    status: int | None  # None: no answer (transport error or hard timeout)
    seconds: float
    problem: str = ""


def _client_loop(index: int, stop_at: float, out: list[Outcome], url: str,
                 lock: threading.Lock) -> None:
    from genaug.wire import decode_batch

    kinds = list(KINDS)
    with httpx.Client(base_url=url, timeout=HARD_TIMEOUT_S,
                      headers={"X-Client-Id": f"load-{index}"}) as client:
        i = 0
        while time.monotonic() < stop_at and i < 100_000:
            kind = kinds[(index + i) % len(kinds)]
            i += 1
            path, body = KINDS[kind]
            started = time.monotonic()
            problem = ""
            try:
                r = client.post(path, json=body)
                status: int | None = r.status_code
                if r.status_code == 200:
                    batch = decode_batch(r.content)
                    expected = body["n"]
                    if kind == "pool sample":
                        if len(batch.images) > expected or str(len(batch.images)) != r.headers.get(
                                "X-Genaug-Count"):
                            problem = f"sample returned {len(batch.images)} images"
                    elif len(batch.images) != expected:
                        problem = f"{len(batch.images)} images for n={expected}"
                elif r.status_code == 429:
                    if not r.headers.get("Retry-After", "").isdigit():
                        problem = "429 without Retry-After"
                elif r.status_code != 504:
                    problem = f"status {r.status_code}: {r.text[:200]}"
            except httpx.TimeoutException:
                status, problem = None, f"no answer within {HARD_TIMEOUT_S} s"
            except httpx.HTTPError as exc:
                status, problem = None, f"{type(exc).__name__}: {exc}"
            seconds = time.monotonic() - started
            with lock:
                out.append(Outcome(kind, status, seconds, problem))
            if status == 429:
                time.sleep(0.1)  # back off briefly; a polite client would honour Retry-After


def check_load(*, clients: int = 8, seconds: float = 10.0, workdir: Path | None = None
               ) -> CheckResult:
    """``clients`` threads for ``seconds`` against a child service; see the module doc."""
    result = CheckResult("Load", "load")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmpdir = Path(tmp)
        (tmpdir / "recipes.yaml").write_text(RECIPE)
        args = ["--recipes", str(tmpdir / "recipes.yaml"), "--pool-path", str(tmpdir / "pool.db"),
                "--pool-capacity-per-label", "32", "--max-batch-images", "8",
                "--max-queue-images", str(MAX_QUEUE), "--max-wait-ms", "10",
                "--request-timeout-s", "20", "--log-level", "warning"]
        with child_service(args, log_path=tmpdir / "service.log") as child:
            bind = listen_addresses(child.pid, child.port)
            result.figures["bind"] = bind
            outcomes: list[Outcome] = []
            lock = threading.Lock()
            warmup_s = max(2.0, 0.2 * seconds)
            stop_at = time.monotonic() + warmup_s + seconds
            threads = [threading.Thread(target=_client_loop,
                                        args=(i, stop_at, outcomes, child.url, lock),
                                        name=f"load-client-{i}", daemon=True)
                       for i in range(clients)]
            for t in threads:
                t.start()
            depths: list[float] = []
            rss: list[tuple[float, int]] = []
            poll_errors = 0
            warm_end = time.monotonic() + warmup_s
            rss_base: int | None = None
            while time.monotonic() < stop_at:
                try:
                    depths.append(read_metric(child.url, "genaug_queue_images", timeout=5))
                except httpx.HTTPError:
                    poll_errors += 1
                rss.append((time.monotonic(), rss_bytes(child.pid)))
                if rss_base is None and time.monotonic() >= warm_end:
                    rss_base = rss[-1][1]
                time.sleep(0.1)
            for t in threads:
                t.join(timeout=HARD_TIMEOUT_S + 5)
            hung_threads = sum(t.is_alive() for t in threads)
            rss_end = rss_bytes(child.pid)
            five_xx_log = child.log().count("Traceback")
    result.seconds = time.monotonic() - started

    sent = len(outcomes)
    answered = [o for o in outcomes if o.status is not None]
    by_status: dict[int | None, int] = defaultdict(int)
    for o in outcomes:
        by_status[o.status] += 1
    server_errors = sum(n for s, n in by_status.items() if s is not None and s >= 500 and s != 504)
    problems = [o.problem for o in outcomes if o.problem]
    result.add(
        f"{clients} clients x {seconds:.0f} s (+{warmup_s:.0f} s warm-up): requests sent, "
        "answered with images, 429 + Retry-After or 504",
        sent,
        f"{len(answered)} answered: {by_status.get(200, 0)} x 200, {by_status.get(429, 0)} x "
        f"429, {by_status.get(504, 0)} x 504",
        lost=f"{sent - len(answered)} unanswered, {hung_threads} clients hung",
        ok=sent > 0 and len(answered) == sent and hung_threads == 0 and not problems,
        problems=problems[:5],
    )
    result.add("no 5xx (other than 504 for expired deadlines)", sent,
               f"{server_errors} x 5xx; {five_xx_log} tracebacks in the service log",
               lost="nothing" if server_errors == 0 else f"{server_errors} requests",
               ok=server_errors == 0 and five_xx_log == 0)
    result.add("429 and 504 paths exercised", sent,
               f"{by_status.get(429, 0)} x 429 (all with Retry-After), "
               f"{by_status.get(504, 0)} x 504",
               ok=by_status.get(429, 0) > 0 and by_status.get(504, 0) > 0)
    max_depth = max(depths) if depths else float("nan")
    result.add(f"queue depth polled from /metrics every 0.1 s (bound {MAX_QUEUE} images)",
               len(depths), f"max {max_depth:.0f} images",
               ok=bool(depths) and max_depth <= MAX_QUEUE,
               poll_errors=poll_errors)
    base = rss_base or (rss[0][1] if rss else 0)
    growth = (rss_end - base) / base if base else float("nan")
    peak = max((v for _, v in rss), default=0)
    result.add("service RSS after warm-up vs end (limit +10 %)", len(rss),
               f"{base / 2**20:.0f} MiB -> {rss_end / 2**20:.0f} MiB ({growth:+.1%}; "
               f"peak {peak / 2**20:.0f} MiB)", ok=growth < 0.10)
    latency_rows = []
    for kind in KINDS:
        mine = [o for o in outcomes if o.kind == kind]
        counts: defaultdict[int | None, int] = defaultdict(int)
        for o in mine:
            counts[o.status] += 1
        ok_lat = [o.seconds for o in mine if o.status == 200]
        all_lat = [o.seconds for o in mine if o.status is not None]
        latency_rows.append([kind, len(mine), counts.get(200, 0), counts.get(429, 0),
                             counts.get(504, 0), len(mine) - len([o for o in mine if o.status]),
                             ms(percentile(ok_lat, 50)), ms(percentile(ok_lat, 99)),
                             ms(percentile(all_lat, 50)), ms(percentile(all_lat, 99))])
    result.tables.append(Table(
        "Latency per kind (client side)",
        ["kind", "sent", "200", "429", "504", "lost", "p50 (200)", "p99 (200)", "p50 (all)",
         "p99 (all)"],
        latency_rows,
    ))
    result.figures.update(sent=sent, by_status=dict(by_status), max_depth=max_depth,
                          rss_base=base, rss_end=rss_end, growth=growth)
    return result
