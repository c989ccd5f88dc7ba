"""Two replicas on one PostgreSQL pool against one replica: distinct images per second.

Child-process services (tiny model, one torch thread each, ``pregenerate=false``), a
three-label recipe (32x32, 2 steps), ``max_batch_images=4``. Rounds alternate:

- ``one``: a fresh database, one replica; ``POST /fill`` raises every label to ``per_label``;
  time from the POST to the pool holding every image (polled every 20 ms).
- ``two``: a fresh database, two replicas; the fill is asked of both at once (it is one
  shared target); same clock. Distinct seeds and duplicates are counted in the database.

Then sample latency, in the same run: ``POST /v1/recipes/bench/sample`` n=64 over loopback,
one replica on the filled PostgreSQL pool against one on a SQLite pool of the same content
size, interleaved, ``--samples`` calls each.

The PostgreSQL server is a throwaway cluster (``initdb``/``pg_ctl``, as the tests use) unless
``--pool-url`` names a database to use (its tables are created; pools are per recipe spec).

    python -m bench.pool.replicas [--quick] [--json out.json]

Goals: two replicas >= 1.6x one replica's distinct images/s (2 cores, one torch thread per
replica, quiet machine), 0 duplicate seeds; PostgreSQL sample p50 < 10 ms.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness import ROOT, finish, goal_text, main, median, parse_args, percentile, table
from bench.services import services, write_recipe

GOAL_SPEEDUP = 1.6
GOAL_PG_P50_MS = 10.0


def pg_cluster() -> Any:
    """The tests' throwaway PostgreSQL server, loaded from its file (tests/ is no package)."""
    import importlib.util

    path = ROOT / "tests" / "service" / "pool" / "_postgres.py"
    spec = importlib.util.spec_from_file_location("_postgres", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cluster = module.PgCluster()
    cluster.start()
    return cluster


def fill_pool(http: Any, urls: Sequence[str], per_label: int, labels: int) -> float:
    """Seconds from asking every replica for the fill to the pool holding all of it."""
    started = time.perf_counter()
    for url in urls:
        r = http.post(f"{url}/v1/recipes/bench/fill", json={"per_label": per_label})
        r.raise_for_status()
    from genaug.experiments.fewshot import poll_pool

    poll_pool(lambda: dict(http.get(f"{urls[0]}/v1/recipes/bench").json()),
              per_label=per_label, timeout=600, poll_s=0.02,
              filled=lambda detail: sum(detail["fill"].values()) >= per_label * labels)
    return time.perf_counter() - started


def _duplicates(url: str, pool_id: str) -> tuple[int, int]:
    from genaug.service.pool.open import open_pool

    with open_pool(url, capacity_per_label=10**6) as store:
        seeds = [seed for _, seed, _ in store.reads.iter_images(pool_id)]
    return len(seeds), len(seeds) - len(set(seeds))


def sample_latency(http: Any, url: str, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        r = http.post(f"{url}/v1/recipes/bench/sample", json={"n": 64})
        out.append((time.perf_counter() - t0) * 1000)
        assert r.status_code == 200 and r.headers["X-Genaug-Count"] == "64", r.text
    return out


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__ or "", argv)
    import httpx

    labels = ("A", "B", "C")
    per_label = 8 if args.quick else 40
    rounds = 1 if args.quick else 3
    samples = 16 if args.quick else 64
    load_before = os.getloadavg()
    cluster = pg_cluster()
    rates: dict[str, list[float]] = {"one": [], "two": []}
    dupes: dict[str, list[int]] = {"one": [], "two": []}
    latency: dict[str, list[float]] = {"postgresql": [], "sqlite": []}
    try:
        with tempfile.TemporaryDirectory() as tmp, httpx.Client(timeout=120) as http:
            folder = Path(tmp)
            recipes = write_recipe(folder, labels=labels, size=32, steps=2)
            common = {"recipes": recipes, "max_batch_images": 4, "pregenerate": False,
                      "pool_capacity_per_label": 1000, "warmup": True}
            for r in range(rounds):
                for phase, count in (("one", 1), ("two", 2)):
                    db = cluster.new_database()
                    specs = {f"{phase}{i}": {**common, "pool_url": db} for i in range(count)}
                    with services(specs, threads=args.threads) as urls:
                        seconds = fill_pool(http, list(urls.values()), per_label, len(labels))
                        pid = http.get(f"{next(iter(urls.values()))}/v1/recipes/bench"
                                       ).json()["pool_id"]
                        total, dup = _duplicates(db, pid)
                        rates[phase].append((total - dup) / seconds)
                        dupes[phase].append(dup)
                        print(f"round {r} {phase}: {total} images in {seconds:.2f} s, "
                              f"{dup} duplicate seeds", flush=True)
            # sample latency: PostgreSQL vs SQLite, same content size, interleaved
            db = cluster.new_database()
            specs = {
                "postgresql": {**common, "pool_url": db},
                "sqlite": {**common, "pool_path": folder / "pool.db"},
            }
            with services(specs, threads=args.threads) as urls:
                for name in specs:  # fill each pool (one at a time: 2 cores)
                    fill_pool(http, [urls[name]], 32, len(labels))
                for _ in range(4):
                    for name in specs:
                        latency[name] += sample_latency(http, urls[name], samples // 4)
    finally:
        cluster.destroy()
    load_after = os.getloadavg()
    one, two = median(rates["one"]), median(rates["two"])
    speedup = two / one if one else 0.0
    pg_p50 = percentile(latency["postgresql"], 50)
    result: dict[str, Any] = {
        "per_label": per_label,
        "rounds": rounds,
        "distinct_images_per_s": {"one": one, "two": two},
        "speedup": speedup,
        "duplicate_seeds": {k: sum(v) for k, v in dupes.items()},
        "sample_ms": {
            name: {"p50": percentile(v, 50), "p99": percentile(v, 99), "n": len(v)}
            for name, v in latency.items()
        },
        "load_average": {"before": load_before, "after": load_after},
        "goals": {
            "speedup": speedup >= GOAL_SPEEDUP,
            "no_duplicates": sum(dupes["two"]) == 0,
            "pg_p50": pg_p50 < GOAL_PG_P50_MS,
        },
    }
    table(
        "Replicas on one PostgreSQL pool (distinct images/s while filling)",
        ["replicas", "images/s (median)", "duplicate seeds"],
        [[1, one, sum(dupes["one"])], [2, two, sum(dupes["two"])]],
    )
    table(
        "Sample n=64 over loopback",
        ["pool", "p50 ms", "p99 ms", "calls"],
        [[name, v["p50"], v["p99"], v["n"]] for name, v in result["sample_ms"].items()],
    )
    print(f"\nspeedup {speedup:.2f}x (goal >= {GOAL_SPEEDUP}: "
          f"{goal_text(result['goals']['speedup'])}); duplicates "
          f"{goal_text(result['goals']['no_duplicates'])}; PostgreSQL p50 {pg_p50:.2f} ms "
          f"(goal < {GOAL_PG_P50_MS}: {goal_text(result['goals']['pg_p50'])}); load average "
          f"before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    return finish(result, args.json)


if __name__ == "__main__":
    main(run)
