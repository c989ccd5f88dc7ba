"""Clients that keep a few requests in flight share the generator by time, and a notebook
stays quick beside a client that saturates it: this tree's service (optionally beside
another revision's).

Each service is a ``python -m genaug.service`` child (the default tiny-digits model, batches
of 8, ``max_wait_ms`` 10, one torch thread); with ``--old REV`` a second one imports that
revision (checked out into a temporary git worktree, as ``compare_trees.py`` does) and every
window below runs on both at the same time, so both see the same machine. Windows:

1. **pair**: two closed-loop clients, each keeping two ``/v1/generate`` requests of 4 images
   in flight (two threads asking one after the other), one ``costly`` (256x256 at 60
   steps), one ``cheap`` (64x64 at 20 steps); each one's share of generator time is read
   from ``GET /v1/clients`` (``generation_s`` deltas), its images per second from its own
   answers;
2. **costly alone**, 3. **cheap alone**: the same clients one at a time (the throughput of
   one saturating client, and the rates that normalise the pair's: the pair's *work rate*
   is the sum over both clients of their images per second in the pair over alone, 1.0
   when nothing is lost to switching);
4. **notebook idle**: ``n=1`` requests (interactive, the model's default size and steps)
   sent every ``--every-s`` seconds (open loop) on an otherwise idle service;
5. **notebook busy**: the same beside the costly client, also interactive, saturating.

One step of the costly batch is its batch time alone (window 2: 8 images over its images
per second) over its steps.

Goals: the costly client's share 0.4-0.6 (about 0.85 before); notebook busy p50
at most 1.5 x idle p50 + one costly step; costly alone and the pair's work rate at least
0.95 of the old tree's (with ``--old``).

``--quick`` keeps the shapes' structure at a quarter of the area and half the steps
(128x128 at 30 steps against 32x32 at 10: about 5x apart per batch on the tiny pipeline,
as the full shapes are) and 30 s windows. ``--repeat K`` measures the pair window K times
in a row (each its own figure; the goal holds when every one is in 0.4-0.6);
``--share-only`` runs only those pair windows. Every window prints the load average
before and after it, and the run starts with the date and the machine: the figures are
read beside whatever else the machine runs.

Each request asks ``timeout_s`` 600: on a busy 2-core machine a costly batch shared half and
half can take longer than the service's default deadline (120 s), and a 504 would end that
client's closed loop. A request that fails anyway is counted (``failed``) and the loop asks
again.

    python -m bench closed_loop_share [--old REV] [--quick] [--repeat K] [--share-only]
                                      [--slice-ms MS] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.harness import ROOT, finish, goal_text, main, percentile, table
from bench.service.compare_trees import checkout, child, importable
from bench.service.preemption import notebook_load

IN_FLIGHT = 2
N = 4
TIMEOUT_S = 600  # each request's deadline (the service's default is 120 s)
FULL = {"costly": {"height": 256, "width": 256, "steps": 60},
        "cheap": {"height": 64, "width": 64, "steps": 20}}
QUICK = {"costly": {"height": 128, "width": 128, "steps": 30},
         "cheap": {"height": 32, "width": 32, "steps": 10}}


def _closed_loop(url: str, client_id: str, shape: dict[str, int], stop: threading.Event,
                 done: list[float], failed: list[str]) -> None:
    """``IN_FLIGHT`` threads, each asking ``N`` images, again as soon as the answer is in;
    the time of every answer goes to ``done``, what a failed request got to ``failed``."""
    import httpx

    def one_thread(i: int) -> None:
        with httpx.Client(timeout=TIMEOUT_S + 60, headers={"X-Client-Id": client_id}) as http:
            seed = i * 100_000
            while not stop.is_set():
                r = http.post(f"{url}/v1/generate", json={
                    "prompt": "a handwritten seven", "n": N, "seed": seed,
                    "timeout_s": TIMEOUT_S, **shape})
                if r.is_success:
                    done.append(time.perf_counter())
                else:  # counted, and asked again: the client keeps its requests in flight
                    failed.append(f"{r.status_code} {r.text[:200]}")
                seed += N

    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        for future in [pool.submit(one_thread, i) for i in range(IN_FLIGHT)]:
            future.result()


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as ``uptime`` prints them."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def conditions() -> dict[str, Any]:
    """When and where a run was measured."""
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs",
            "load_average": load_average()}


def _generation_s(url: str) -> dict[str, float]:
    import httpx

    body = httpx.get(f"{url}/v1/clients", timeout=30).json()
    return {c["client"]: c["generation_s"] for c in body["clients"]}


def _window(urls: dict[str, str], seconds: float, shapes: dict[str, dict[str, int]], *,
            loops: Sequence[str], notebook: bool, every_s: float) -> dict[str, dict[str, Any]]:
    """Run closed-loop clients ``loops`` (and the notebook) on every service at once for
    ``seconds``, measuring over the last four fifths; per service: images per second and
    share of generator time per client, and the notebook's latencies."""
    stop = threading.Event()
    done: dict[str, dict[str, list[float]]] = {side: {name: [] for name in loops}
                                                for side in urls}
    failed: dict[str, dict[str, list[str]]] = {side: {name: [] for name in loops}
                                                for side in urls}
    latencies: dict[str, list[float]] = {side: [] for side in urls}
    threads = [threading.Thread(target=_closed_loop,
                                args=(url, name, shapes[name], stop, done[side][name],
                                      failed[side][name]))
               for side, url in urls.items() for name in loops]
    load_before = load_average()
    if notebook:
        threads += [threading.Thread(target=notebook_load,
                                     args=(url, stop, latencies[side], every_s),
                                     kwargs={"timeout_s": 600.0})
                    for side, url in urls.items()]
    for thread in threads:
        thread.start()
    time.sleep(seconds / 5)  # requests in flight before measuring
    t0 = time.perf_counter()
    before = {side: _generation_s(url) for side, url in urls.items()}
    latency_start = {side: len(latencies[side]) for side in urls}
    time.sleep(seconds * 4 / 5)
    t1 = time.perf_counter()
    after = {side: _generation_s(url) for side, url in urls.items()}
    measured = {side: list(latencies[side][latency_start[side]:]) for side in urls}
    stop.set()
    for thread in threads:
        thread.join()
    load = [load_before, load_average()]
    out: dict[str, dict[str, Any]] = {}
    for side in urls:
        used = {name: after[side].get(name, 0.0) - before[side].get(name, 0.0) for name in loops}
        total = sum(used.values()) or 1.0
        out[side] = {
            "images_per_s": {name: N * sum(1 for t in done[side][name] if t0 <= t < t1)
                             / (t1 - t0) for name in loops},
            "share": {name: used[name] / total for name in loops},
            "latencies": measured[side],
            "failed": {name: failed[side][name] for name in loops if failed[side][name]},
            "load_average": load,
        }
    return out


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--old", help="also run this git revision beside this tree")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--window-s", type=float, help="seconds per window (default 120; 30)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="measure the pair window this many times (default 1)")
    parser.add_argument("--share-only", action="store_true",
                        help="only the pair windows: no alone or notebook windows")
    parser.add_argument("--every-s", type=float, default=1.0,
                        help="the notebook sends one n=1 request this often")
    parser.add_argument("--slice-ms", type=float, help="GENAUG_SLICE_MS of this tree's service")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat} is below 1; measure the pair at least once")

    shapes = QUICK if args.quick else FULL
    window = args.window_s or (30.0 if args.quick else 120.0)
    sides = ("old", "new") if args.old else ("new",)
    where = conditions()
    print(f"{where['date']}, {where['machine']}, load average {where['load_average']}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="genaug-closed-loop-") as tmp:
        folder = Path(tmp)
        with contextlib.ExitStack() as stack:
            paths = {"new": importable(ROOT, folder / "new")}
            if args.old:
                paths["old"] = stack.enter_context(checkout(args.old, folder / "old"))
            urls: dict[str, str] = {}
            for side in sides:
                settings: dict[str, Any] = {"max_batch_images": 8, "max_wait_ms": 10,
                                            "pregenerate": False}
                if side == "new" and args.slice_ms is not None:
                    settings["slice_ms"] = args.slice_ms
                urls[side] = stack.enter_context(child(paths[side], 1, settings))
            import httpx

            for url in urls.values():  # first-call costs out of the way
                for shape in shapes.values():
                    httpx.post(f"{url}/v1/generate", json={"prompt": "warm", "n": 1, **shape},
                               timeout=600).raise_for_status()
            kw = {"every_s": args.every_s}
            pairs = []
            for k in range(args.repeat):
                pair = _window(urls, window, shapes, loops=["costly", "cheap"], notebook=False,
                               **kw)
                pairs.append(pair)
                for side in sides:
                    r = pair[side]
                    fails = sum(len(f) for f in r["failed"].values())
                    print(f"pair {k + 1}/{args.repeat} {side}: costly share "
                          f"{r['share']['costly']:.2f}, images/s costly "
                          f"{r['images_per_s']['costly']:.2f} cheap "
                          f"{r['images_per_s']['cheap']:.2f}, failed requests {fails}, load "
                          f"average {r['load_average'][0]} -> {r['load_average'][1]}",
                          flush=True)
            if not args.share_only:
                costly = _window(urls, window, shapes, loops=["costly"], notebook=False, **kw)
                cheap = _window(urls, window, shapes, loops=["cheap"], notebook=False, **kw)
                idle = _window(urls, window, shapes, loops=[], notebook=True, **kw)
                busy = _window(urls, window, shapes, loops=["costly"], notebook=True, **kw)

    result: dict[str, Any] = {"window_s": window, "shapes": shapes, "old": args.old,
                              "slice_ms": args.slice_ms, "conditions": where}
    for side in sides:
        shares = [pair[side]["share"]["costly"] for pair in pairs]
        result[side] = {
            "costly_share": shares[0] if len(shares) == 1 else sorted(shares)[len(shares) // 2],
            "costly_shares": shares,
            "pair_images_per_s": [pair[side]["images_per_s"] for pair in pairs],
            "pair_failed": [pair[side]["failed"] for pair in pairs],
            "pair_load_average": [pair[side]["load_average"] for pair in pairs],
        }
    new = result["new"]
    result["share_goal_met"] = all(0.4 <= s <= 0.6 for s in new["costly_shares"])
    shares_text = ", ".join(f"{s:.2f}" for s in new["costly_shares"])
    print(f"costly share {shares_text} (goal 0.4-0.6 in every run): "
          f"{goal_text(result['share_goal_met'])}")
    if args.old:
        old_text = ", ".join(f"{s:.2f}" for s in result["old"]["costly_shares"])
        print(f"costly share on {args.old}: {old_text}")
    if args.share_only:
        return finish(result, args.json)

    rows = []
    for side in sides:
        alone = {"costly": costly[side]["images_per_s"]["costly"],
                 "cheap": cheap[side]["images_per_s"]["cheap"]}
        work = sum(pairs[0][side]["images_per_s"][c] / alone[c] for c in alone if alone[c] > 0)
        step_s = 8 / alone["costly"] / shapes["costly"]["steps"] if alone["costly"] else 0.0
        idle_p50 = percentile(idle[side]["latencies"], 50)
        busy_p50 = percentile(busy[side]["latencies"], 50)
        bound = 1.5 * idle_p50 + step_s
        r = result[side]
        r.update({
            "alone_images_per_s": alone,
            "pair_work_rate": work,
            "costly_step_s": step_s,
            "notebook_idle_p50_s": idle_p50,
            "notebook_busy_p50_s": busy_p50,
            "notebook_busy_p90_s": percentile(busy[side]["latencies"], 90),
            "notebook_bound_s": bound,
            "notebook_requests": [len(idle[side]["latencies"]), len(busy[side]["latencies"])],
        })
        rows.append([side, f"{r['costly_share']:.2f}", f"{alone['costly']:.3f}",
                     f"{alone['cheap']:.2f}", f"{work:.2f}", f"{idle_p50:.2f}",
                     f"{busy_p50:.2f}", f"{step_s:.3f}"])
    table("Closed-loop clients (2 x n=4 in flight each) and a notebook beside a saturating one",
          ["tree", "costly share", "costly alone img/s", "cheap alone img/s",
           "pair work rate", "notebook idle p50 s", "busy p50 s", "costly step s"], rows)
    result["notebook_goal_met"] = new["notebook_busy_p50_s"] <= new["notebook_bound_s"]
    print(f"notebook busy p50 {new['notebook_busy_p50_s']:.2f} s (goal <= 1.5 x idle + one "
          f"costly step = {new['notebook_bound_s']:.2f} s): "
          f"{goal_text(result['notebook_goal_met'])}")
    if args.old:
        old = result["old"]
        alone_ratio = new["alone_images_per_s"]["costly"] / old["alone_images_per_s"]["costly"]
        work_ratio = new["pair_work_rate"] / old["pair_work_rate"]
        result["alone_new_over_old"] = alone_ratio
        result["work_rate_new_over_old"] = work_ratio
        result["throughput_goal_met"] = alone_ratio >= 0.95 and work_ratio >= 0.95
        print(f"costly alone new/old {alone_ratio:.2f}, pair work rate new/old {work_ratio:.2f}"
              f" (goal >= 0.95 each): {goal_text(result['throughput_goal_met'])}")
    print(f"load average at the end: {load_average()}")
    return finish(result, args.json)

if __name__ == "__main__":
    main(run)
