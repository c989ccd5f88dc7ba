"""Pool sample latency on loopback: n=64 images of 64x64 through the real service.

A child-process service with a two-label recipe (64x64, 1 step so it fills in seconds) and
``pool_capacity_per_label=100`` pre-generates 200 images, then stops (pools at capacity).
The sync :class:`~genaug.client.Client` samples ``n=64`` over one keep-alive connection;
each latency is the full call (request, SQLite read, safetensors encode, transfer, decode).
For comparison, :meth:`PoolStore.sample` runs in this process on the same SQLite file.
Rounds alternate HTTP / in-process blocks, plus a few ``n=1`` HTTP samples that show the
fixed cost of a call apart from moving the 786 KB of pixels.

    python bench/pool_latency.py [--quick]

Goal: HTTP p50 < 5 ms, p99 < 20 ms.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, __file__.rsplit("/", 1)[0])

from _common import (  # noqa: E402
    finish,
    goal_text,
    interleave,
    median,
    parse_args,
    percentile,
    service,
    table,
    wait_generated,
    write_recipe,
)

GOAL_P50_MS = 5.0
GOAL_P99_MS = 20.0
N = 64


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__ or "", argv)
    import httpx

    from genaug.client import Client
    from genaug.service.pool import PoolStore

    capacity = 50 if args.quick else 100
    requests = 60 if args.quick else 300
    rounds = 3 if args.quick else 6
    per_round = requests // rounds
    labels = ("A", "B")
    with tempfile.TemporaryDirectory(prefix="genaug-bench-") as tmp:
        folder = Path(tmp)
        recipes = write_recipe(folder, labels=labels, steps=1)
        db = folder / "pool.db"
        with (
            service(
                threads=args.threads,
                recipes=recipes,
                pool_path=db,
                pool_capacity_per_label=capacity,
                max_batch_images=8,
            ) as url,
            httpx.Client(timeout=60) as http,
            Client(url, timeout=60) as client,
        ):
            _, detail = wait_generated(http, url, "bench", capacity * len(labels))
            time.sleep(0.2)  # let the last batch's commit and the idle check settle
            store = PoolStore(db, capacity_per_label=capacity)
            http_ms: list[float] = []
            one_ms: list[float] = []
            local_ms: list[float] = []
            for _ in range(5):  # warm both paths (connection, page cache, imports)
                client.sample("bench", n=N)
                store.sample(detail["pool_id"], list(labels), N)

            def via_http() -> float:
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    got = client.sample("bench", n=N)
                    http_ms.append((time.perf_counter() - t0) * 1000)
                    assert len(got) == N
                return 0.0

            def via_http_one() -> float:
                # The fixed cost of a sample call (routing, SQLite, thread hops), few bytes.
                for _ in range(per_round // 3):
                    t0 = time.perf_counter()
                    client.sample("bench", n=1)
                    one_ms.append((time.perf_counter() - t0) * 1000)
                return 0.0

            def in_process() -> float:
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    got = store.sample(detail["pool_id"], list(labels), N)
                    local_ms.append((time.perf_counter() - t0) * 1000)
                    assert len(got.images) == N
                return 0.0

            interleave(
                rounds, {"http": via_http, "in_process": in_process, "http_n1": via_http_one}
            )
            store.close()

    p50, p99 = percentile(http_ms, 50), percentile(http_ms, 99)
    l50, l99 = percentile(local_ms, 50), percentile(local_ms, 99)
    met = p50 < GOAL_P50_MS and p99 < GOAL_P99_MS
    table(
        f"Pool sample latency: n={N}, 64x64, {capacity * len(labels)} images in the pool, "
        f"{len(http_ms)} HTTP + {len(local_ms)} in-process samples, {rounds} rounds",
        ["path", "p50 ms", "p99 ms", "max ms", "mean ms", "goal"],
        [
            [
                "HTTP (sync Client, keep-alive)",
                p50,
                p99,
                max(http_ms),
                sum(http_ms) / len(http_ms),
                f"p50 < {GOAL_P50_MS}, p99 < {GOAL_P99_MS}: {goal_text(met)}",
            ],
            [
                "in-process PoolStore.sample",
                l50,
                l99,
                max(local_ms),
                sum(local_ms) / len(local_ms),
                "",
            ],
            ["HTTP / in-process", p50 / l50, p99 / l99, "", "", ""],
            [
                "HTTP, n=1 (fixed cost per call)",
                percentile(one_ms, 50),
                percentile(one_ms, 99),
                max(one_ms),
                sum(one_ms) / len(one_ms),
                "",
            ],
        ],
    )
    return finish(
        {
            "benchmark": "pool_latency",
            "n": N,
            "pool_images": capacity * len(labels),
            "http_p50_ms": p50,
            "http_p99_ms": p99,
            "local_p50_ms": l50,
            "local_p99_ms": l99,
            "http_median_ms": median(http_ms),
            "http_n1_p50_ms": percentile(one_ms, 50),
            "goal_p50_ms": GOAL_P50_MS,
            "goal_p99_ms": GOAL_P99_MS,
            "met": met,
        },
        args.json,
    )


if __name__ == "__main__":
    run()
