"""Pool sample latency on loopback: n=64 images of 64x64 through the real service.

A child-process service with a two-label recipe (64x64, 1 step so it fills in seconds) and
``pool_capacity_per_label=100`` pre-generates 200 images, then stops (pools at capacity).
The sync :class:`~genaug.client.Client` samples ``n=64`` over one keep-alive connection;
each latency is the full call (request, SQLite read, safetensors encode, transfer, decode).
For comparison, :meth:`PoolStore.sample` runs in this process on the same SQLite file.
Rounds alternate HTTP / in-process blocks, for ``n=64`` and for ``n=1`` (the fixed cost of a
call apart from moving the 786 KB of pixels). A second client runs on httpx's own transport
(httpcore) instead of the ``http.client`` transport the sync client mounts for ``http://``,
interleaved in the same rounds, so the table shows what that transport saves.

    python -m bench.pool.pool_latency [--quick]

Goals: what HTTP adds to the in-process sample, p50 minus p50 measured in the same run,
under 0.7 ms for n=1 and under 1.5 ms for n=64; and HTTP p50 < 5 ms, p99 < 20 ms for n=64.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.harness import finish, goal_text, interleave, main, median, parse_args, percentile, table
from bench.services import service, wait_generated, write_recipe

GOAL_P50_MS = 5.0
GOAL_P99_MS = 20.0
GOAL_OVERHEAD_N1_MS = 0.7
GOAL_OVERHEAD_N64_MS = 1.5
N = 64


def timed(call: Callable[[], Any], times: int, into: list[float], *,
          size: int | None = None) -> float:
    """Make ``call`` ``times`` times, adding each one's milliseconds to ``into`` (and, with
    ``size``, checking each answer holds that many images). Returns 0.0: these phases keep
    their own lists, :func:`~bench.harness.interleave` only orders them."""
    for _ in range(times):
        t0 = time.perf_counter()
        got = call()
        into.append((time.perf_counter() - t0) * 1000)
        assert size is None or len(got) == size, (len(got), size)
    return 0.0


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__ or "", argv)
    import httpx

    from genaug.client import Client
    from genaug.service.pool.open import open_pool

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
            Client(url, timeout=60) as on_httpcore,
        ):
            on_httpcore._http.close()
            on_httpcore._http = httpx.Client(timeout=60)  # httpx's default transport
            _, detail = wait_generated(http, url, "bench", capacity * len(labels))
            time.sleep(0.2)  # let the last batch's commit and the idle check settle
            store = open_pool(db, capacity_per_label=capacity)
            http_ms: list[float] = []
            one_ms: list[float] = []
            local_ms: list[float] = []
            local_one_ms: list[float] = []
            core_ms: list[float] = []
            core_one_ms: list[float] = []
            for _ in range(5):  # warm both paths (connection, page cache, imports)
                client.sample("bench", n=N)
                on_httpcore.sample("bench", n=N)
                store.sample(detail["pool_id"], list(labels), N)

            pool_id, names, few = detail["pool_id"], list(labels), per_round // 3
            interleave(rounds, {
                "http": lambda: timed(lambda: client.sample("bench", n=N), per_round, http_ms,
                                      size=N),
                "in_process": lambda: timed(lambda: store.sample(pool_id, names, N).images,
                                            per_round, local_ms, size=N),
                # the fixed cost of a sample call (routing, SQLite, thread hops), few bytes
                "http_n1": lambda: timed(lambda: client.sample("bench", n=1), few, one_ms),
                "in_process_n1": lambda: timed(lambda: store.sample(pool_id, names, 1), few,
                                               local_one_ms),
                "httpcore": lambda: timed(lambda: on_httpcore.sample("bench", n=N), per_round,
                                          core_ms)
                + timed(lambda: on_httpcore.sample("bench", n=1), few, core_one_ms),
            })
            store.close()

    p50, p99 = percentile(http_ms, 50), percentile(http_ms, 99)
    l50, l99 = percentile(local_ms, 50), percentile(local_ms, 99)
    o50, lo50 = percentile(one_ms, 50), percentile(local_one_ms, 50)
    over64, over1 = p50 - l50, o50 - lo50
    met_latency = p50 < GOAL_P50_MS and p99 < GOAL_P99_MS
    met_overhead = over1 < GOAL_OVERHEAD_N1_MS and over64 < GOAL_OVERHEAD_N64_MS

    def row(name: str, ms: list[float], goal: str = "") -> list[Any]:
        return [name, percentile(ms, 50), percentile(ms, 99), max(ms), sum(ms) / len(ms), goal]

    table(
        f"Pool sample latency: 64x64 images, {capacity * len(labels)} in the pool, "
        f"{len(http_ms)} + {len(local_ms)} samples of n={N} and {len(one_ms)} + "
        f"{len(local_one_ms)} of n=1, {rounds} interleaved rounds",
        ["path", "p50 ms", "p99 ms", "max ms", "mean ms", "goal"],
        [
            row(f"HTTP n={N} (sync Client, keep-alive)", http_ms,
                f"p50 < {GOAL_P50_MS}, p99 < {GOAL_P99_MS}: {goal_text(met_latency)}"),
            row(f"in-process PoolStore.sample n={N}", local_ms),
            row(f"HTTP n={N} on httpx's own transport (before)", core_ms),
            row("HTTP n=1", one_ms),
            row("HTTP n=1 on httpx's own transport (before)", core_one_ms),
            row("in-process PoolStore.sample n=1", local_one_ms),
            ["HTTP - in-process, n=1 (p50)", over1, "", "", "",
             f"< {GOAL_OVERHEAD_N1_MS}: {goal_text(over1 < GOAL_OVERHEAD_N1_MS)}"],
            [f"HTTP - in-process, n={N} (p50)", over64, "", "", "",
             f"< {GOAL_OVERHEAD_N64_MS}: {goal_text(over64 < GOAL_OVERHEAD_N64_MS)}"],
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
            "http_n1_p50_ms": o50,
            "httpcore_p50_ms": percentile(core_ms, 50),
            "httpcore_n1_p50_ms": percentile(core_one_ms, 50),
            "local_n1_p50_ms": lo50,
            "overhead_n1_p50_ms": over1,
            "overhead_n64_p50_ms": over64,
            "goal_p50_ms": GOAL_P50_MS,
            "goal_p99_ms": GOAL_P99_MS,
            "met": met_latency and met_overhead,
        },
        args.json,
    )


if __name__ == "__main__":
    main(run)
