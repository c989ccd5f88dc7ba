"""The api role (``GENAUG_ROLE=api``, no model) against the single process (``all``) on one
PostgreSQL pool: what a trainer's sample costs, what a fill at zero workers waits, and the
api's memory.

Child-process services (tiny model, one torch thread), a three-label recipe (32x32, 2 steps),
``pregenerate=false``. A worker fills the pool (``per_label`` images a label) and stops; the
api starts and stays up, with zero workers throughout its sample rounds. Rounds alternate:

- ``all``: a service of role ``all`` starts on the pool (and stops after its round); ``POST
  /v1/recipes/bench/sample`` n=64 over loopback, ``--samples`` calls;
- ``api``: the same calls to the api, no worker alive.

Then the fill at zero workers: the api is asked for a fill with no worker running; a worker
starts at once; the clock runs from the POST to the job's first accepted image (polled every
50 ms): a cold worker start (model load and warm-up, no compile) plus the first batch. The
api's resident memory and whether torch was ever mapped into it close the run.

The PostgreSQL server is a throwaway cluster (``initdb``/``pg_ctl``, as the tests use).

    python -m bench.pool.api_role [--quick] [--json out.json]

Goals (issue 59): sample p50 through the api at zero workers <= 1.2x through ``all``; the
api's RSS <= 300 MiB with torch never imported.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness import finish, goal_text, main, parse_args, percentile, table
from bench.pool.replicas import fill_pool, pg_cluster, sample_latency
from bench.services import services, write_recipe

GOAL_RATIO = 1.2
GOAL_RSS_MIB = 300.0


def _rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(r for r in status.splitlines() if r.startswith("VmRSS:")).split()[1]) / 1024


def _first_image_s(http: Any, api: str, worker_spec: dict[str, Any], threads: int) -> float:
    """Seconds from a fill asked of ``api`` at zero workers to its job's first image, the
    worker started right after the POST."""
    started = time.perf_counter()
    r = http.post(f"{api}/v1/recipes/bench/fill", json={"per_label": 64})
    r.raise_for_status()
    job = r.json()["job"]["url"]
    assert http.get(f"{api}{job}").json()["state"] == "queued"
    with services({"worker": worker_spec}, threads=threads):
        while http.get(f"{api}{job}").json()["accepted"] < 1:
            time.sleep(0.05)
        return time.perf_counter() - started


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__ or "", argv)
    import httpx

    from genaug.local_service import free_port, running_service
    from genaug.service.testing import wait_ready

    labels = ("A", "B", "C")
    rounds = 2 if args.quick else 4
    samples = 16 if args.quick else 48
    load_before = os.getloadavg()
    cluster = pg_cluster()
    latency: dict[str, list[float]] = {"all": [], "api": []}
    try:
        with tempfile.TemporaryDirectory() as tmp, httpx.Client(timeout=120) as http:
            folder = Path(tmp)
            recipes = write_recipe(folder, labels=labels, size=32, steps=2)
            db = cluster.new_database()
            common = {"recipes": recipes, "max_batch_images": 4, "pregenerate": False,
                      "pool_capacity_per_label": 1000, "pool_url": db}
            with services({"first": {**common, "role": "worker"}}, threads=args.threads) as up:
                fill_pool(http, [up["first"]], 32, len(labels))
            port = free_port()
            settings = ["--role", "api", "--recipes", str(recipes), "--pool-url", db,
                        "--pregenerate", "false", "--pool-capacity-per-label", "1000"]
            with running_service(port, extra_args=settings,
                                 log_path=folder / "api.log") as api_proc:
                api = f"http://127.0.0.1:{port}"
                wait_ready(api, timeout=120, alive=lambda: api_proc.poll() is None)
                while http.get(f"{api}/v1/recipes/bench").status_code != 200:
                    time.sleep(0.1)  # the newest worker's pools, read from the database
                for r in range(rounds):
                    with services({"all": {**common, "role": "all"}},
                                  threads=args.threads) as up:
                        latency["all"] += sample_latency(http, up["all"], samples)
                    while http.get(f"{api}/v1/info").status_code != 200:
                        time.sleep(0.1)
                    latency["api"] += sample_latency(http, api, samples)
                    print(f"round {r}: all p50 {percentile(latency['all'], 50):.2f} ms, api "
                          f"p50 {percentile(latency['api'], 50):.2f} ms", flush=True)
                time.sleep(2.0)  # the last all-role process's lease: zero workers again
                first_image_s = _first_image_s(http, api, {**common, "role": "worker"},
                                               args.threads)
                rss = _rss_mib(api_proc.pid)
                torch_mapped = "libtorch" in Path(f"/proc/{api_proc.pid}/maps").read_text()
    finally:
        cluster.destroy()
    load_after = os.getloadavg()
    p50 = {name: percentile(values, 50) for name, values in latency.items()}
    ratio = p50["api"] / p50["all"] if p50["all"] else 0.0
    result: dict[str, Any] = {
        "rounds": rounds,
        "sample_ms": {name: {"p50": p50[name], "p99": percentile(v, 99), "n": len(v)}
                      for name, v in latency.items()},
        "api_over_all_p50": ratio,
        "fill_at_zero_workers_first_image_s": first_image_s,
        "api_rss_mib": rss,
        "api_torch_mapped": torch_mapped,
        "load_average": {"before": load_before, "after": load_after},
        "goals": {"ratio": ratio <= GOAL_RATIO,
                  "rss": rss <= GOAL_RSS_MIB and not torch_mapped},
    }
    table("Sample n=64 over loopback, one PostgreSQL pool (the api at zero workers)",
          ["role", "p50 ms", "p99 ms", "calls"],
          [[name, v["p50"], v["p99"], v["n"]] for name, v in result["sample_ms"].items()])
    table("A fill asked at zero workers", ["worker start", "to the first image, s"],
          [["cold (model load, warm-up; no compile)", first_image_s]])
    print(f"\napi / all p50 {ratio:.2f} (goal <= {GOAL_RATIO}: "
          f"{goal_text(result['goals']['ratio'])}); api RSS {rss:.0f} MiB, torch "
          f"{'mapped' if torch_mapped else 'never imported'} (goal <= {GOAL_RSS_MIB:.0f} MiB: "
          f"{goal_text(result['goals']['rss'])}); load average before {load_before[0]:.2f}, "
          f"after {load_after[0]:.2f}")
    return finish(result, args.json)


if __name__ == "__main__":
    main(run)
