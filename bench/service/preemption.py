"""People first and work nobody waits for: this tree's service against another revision's.

Two services run at once as ``python -m genaug.service`` children with the same settings
(the default tiny-digits model, a two-label recipe at 64x64 and 20 steps, batches of 8, one
torch thread each), one importing this working tree, the other ``--old`` (checked out into a
temporary git worktree, as ``bench.service.compare_trees`` does). Every window below runs on both
services at the same time, so both see the same machine:

1. **idle**: a notebook sends ``n=1`` (interactive) every ``--every-s`` seconds (open loop:
   the same offered load on both trees, whatever their latency); nothing else runs;
2. **pool filling, with the notebook**: each pool's target is raised far above what fits in
   the run, so pre-generation never stops; the same notebook; the pool's images per second
   are taken between two stored batches (``GET /v1/recipes/bench``), so batch-sized steps
   do not quantise them;
3. **pool filling, no notebook**: the fill rate alone;
4. **abandoned request** (between windows 1 and 2, one service at a time, nothing else
   running): a client asks ``n=8`` at 128x128 and ``--abandon-steps`` steps, hangs up after
   1 s, and a notebook's ``n=1`` follows at once; that answer's latency, less the same
   request's median latency just before, is how long the worker stayed busy with work nobody
   waited for (compared with one denoising step of that batch, measured too).

Goals: busy p50 / idle p50 <= 1.3 on this tree; fill rate with the notebook at
most 10 % below the old tree's; the abandoned batch frees the worker within one step.

    python -m bench.service.preemption --old REV [--quick] [--json out.json]
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.harness import ROOT, finish, goal_text, main, make_parser, percentile, table
from bench.service.compare_trees import checkout, child, importable
from bench.services import write_recipe

SIDES = ("old", "new")
CAPACITY = 100_000


def notebook_load(url: str, stop: threading.Event, latencies: list[float], every_s: float,
                  *, timeout_s: float = 120.0) -> None:
    """n=1 interactive requests sent every ``every_s`` seconds until ``stop`` (open loop: the
    same offered load whatever the answers' latency), each answer's latency recorded; each
    request may take up to ``timeout_s``."""
    import httpx

    def one(http: httpx.Client, seed: int) -> None:
        started = time.perf_counter()
        r = http.post(f"{url}/v1/generate", json={"prompt": "a handwritten seven", "n": 1,
                                                  "seed": seed})
        r.raise_for_status()
        latencies.append(time.perf_counter() - started)

    with httpx.Client(timeout=timeout_s, headers={"X-Client-Id": "notebook"}) as http, \
            ThreadPoolExecutor(8) as pool:
        futures = []
        due = time.perf_counter()
        i = 0
        while not stop.is_set():
            futures.append(pool.submit(one, http, i))
            i += 1
            due += every_s
            stop.wait(max(0.0, due - time.perf_counter()))
        for future in futures:
            future.result()


def _generated(url: str) -> int:
    import httpx

    return int(httpx.get(f"{url}/v1/recipes/bench", timeout=30).json()["totals"]["generated"])


def _next_batch_end(url: str, timeout: float = 120.0) -> tuple[float, int]:
    """Wait for the pool's count to change (a batch was stored); its time and the count.
    Rates are taken between two such moments, so batch-sized steps do not quantise them."""
    start = _generated(url)
    deadline = time.monotonic() + timeout
    while True:
        now = _generated(url)
        if now != start:
            return time.perf_counter(), now
        if time.monotonic() > deadline:
            raise RuntimeError(f"the pool at {url} stored nothing in {timeout:g} s")
        time.sleep(0.02)


def _window(urls: dict[str, str], seconds: float, *, notebook: bool, every_s: float,
            filling: bool) -> dict[str, dict[str, Any]]:
    """Run one window on every service at once; latencies and pool images per second."""
    stop = threading.Event()
    latencies: dict[str, list[float]] = {side: [] for side in urls}
    threads = [threading.Thread(target=notebook_load, args=(url, stop, latencies[side], every_s))
               for side, url in urls.items()] if notebook else []
    for thread in threads:
        thread.start()
    sides = list(urls)

    def batch_ends(pool: ThreadPoolExecutor) -> dict[str, tuple[float, int]]:
        if not filling:
            return {}
        ends = pool.map(_next_batch_end, [urls[side] for side in sides])
        return dict(zip(sides, ends, strict=True))

    with ThreadPoolExecutor(len(urls)) as pool:
        first = batch_ends(pool)
        time.sleep(seconds)
        last = batch_ends(pool)
    stop.set()
    for thread in threads:
        thread.join()
    out: dict[str, dict[str, Any]] = {}
    for side in urls:
        rate = 0.0
        if filling:
            (t0, c0), (t1, c1) = first[side], last[side]
            rate = (c1 - c0) / (t1 - t0)
        out[side] = {"latencies": latencies[side], "fill_per_s": rate}
    return out


def _abandon(url: str, steps: int) -> tuple[float, float]:
    """``(baseline, after)``: the median latency of an n=1 request on the idle service, and
    the latency of the same request sent at once after hanging up on an n=8 request."""
    import httpx

    one = {"prompt": "a handwritten one", "n": 1}
    headers = {"X-Client-Id": "notebook"}

    def timed() -> float:
        started = time.perf_counter()
        httpx.post(f"{url}/v1/generate", json=one, timeout=600,
                   headers=headers).raise_for_status()
        return time.perf_counter() - started

    baseline = percentile([timed() for _ in range(5)], 50)
    body = {"prompt": "a handwritten three", "n": 8, "steps": steps, "height": 128,
            "width": 128, "priority": "interactive"}
    with contextlib.suppress(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/generate", json=body, timeout=1.0,
                   headers={"X-Client-Id": "impatient"})
    return baseline, timed()


def _step_s(url: str, steps: int) -> float:
    """One denoising step of the abandoned batch's shape (n=8, 128x128), measured."""
    import httpx

    body = {"prompt": "a handwritten three", "n": 8, "height": 128, "width": 128}
    times = {}
    for s in (2, 2 + steps // 4):
        started = time.perf_counter()
        httpx.post(f"{url}/v1/generate", json={**body, "steps": s}, timeout=600)
        times[s] = time.perf_counter() - started
    return (times[2 + steps // 4] - times[2]) / (steps // 4)


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = make_parser(__doc__ or "", threads=False)
    parser.add_argument("--old", required=True, help="the git revision to compare against")
    parser.add_argument("--window-s", type=float, help="seconds per window (default 30; 12)")
    parser.add_argument("--every-s", type=float, default=1.0,
                        help="the notebook sends one n=1 request this often")
    parser.add_argument("--abandon-steps", type=int, default=150)
    args = parser.parse_args(argv)
    import httpx

    window = args.window_s or (12.0 if args.quick else 30.0)
    abandon_steps = 60 if args.quick else args.abandon_steps
    with tempfile.TemporaryDirectory(prefix="genaug-preempt-") as tmp:
        folder = Path(tmp)
        recipes = write_recipe(folder, labels=("A", "B"), steps=20)
        with contextlib.ExitStack() as stack:
            paths = {"old": stack.enter_context(checkout(args.old, folder / "old")),
                     "new": importable(ROOT, folder / "new")}
            urls: dict[str, str] = {}
            for side in SIDES:
                settings = {"recipes": recipes, "pool_path": folder / f"{side}.db",
                            "pool_capacity_per_label": CAPACITY, "pregenerate": False,
                            "max_batch_images": 8, "max_wait_ms": 10}
                urls[side] = stack.enter_context(child(paths[side], 1, settings))
            for url in urls.values():  # first-call costs out of the way
                httpx.post(f"{url}/v1/generate", json={"prompt": "warm", "n": 1}, timeout=120)
            idle = _window(urls, window, notebook=True, every_s=args.every_s, filling=False)
            # The abandoned request, one service at a time, while nothing else runs.
            step_s = {side: _step_s(url, abandon_steps) for side, url in urls.items()}
            freed = {side: _abandon(url, abandon_steps) for side, url in urls.items()}
            for url in urls.values():  # pools fill from now on, never reaching the target
                httpx.post(f"{url}/v1/recipes/bench/fill", json={"per_label": CAPACITY},
                           timeout=30).raise_for_status()
            time.sleep(2.0)
            busy = _window(urls, window, notebook=True, every_s=args.every_s, filling=True)
            alone = _window(urls, window, notebook=False, every_s=args.every_s, filling=True)

    result: dict[str, Any] = {"window_s": window, "every_s": args.every_s,
                              "abandon_steps": abandon_steps, "old": args.old}
    rows = []
    for side in SIDES:
        idle_p50 = percentile(idle[side]["latencies"], 50)
        busy_p50 = percentile(busy[side]["latencies"], 50)
        baseline, after = freed[side]
        busy_after = after - baseline  # the worker's time on the abandoned batch
        result[side] = {
            "idle_p50_s": idle_p50, "busy_p50_s": busy_p50, "busy_over_idle": busy_p50 / idle_p50,
            "busy_p90_s": percentile(busy[side]["latencies"], 90),
            "requests": [len(idle[side]["latencies"]), len(busy[side]["latencies"])],
            "fill_with_notebook_per_s": busy[side]["fill_per_s"],
            "fill_alone_per_s": alone[side]["fill_per_s"],
            "abandoned_busy_s": busy_after, "step_s": step_s[side],
            "abandoned_busy_steps": busy_after / step_s[side],
        }
        r = result[side]
        rows.append([side, f"{idle_p50:.3f}", f"{busy_p50:.3f}", f"{r['busy_over_idle']:.2f}x",
                     f"{r['fill_alone_per_s']:.2f}", f"{r['fill_with_notebook_per_s']:.2f}",
                     f"{busy_after:.2f} s = {r['abandoned_busy_steps']:.1f} steps"])
    new, old = result["new"], result["old"]
    result["fill_new_over_old"] = new["fill_with_notebook_per_s"] / old["fill_with_notebook_per_s"]
    table("n=1 interactive while a pool fills; abandoned n=8 request",
                ["tree", "idle p50 s", "busy p50 s", "busy/idle", "fill alone img/s",
                 "fill + notebook img/s", "worker busy after hang-up"], rows)
    print(f"busy/idle on this tree {new['busy_over_idle']:.2f}x (goal <= 1.3x): "
          f"{goal_text(new['busy_over_idle'] <= 1.3)}")
    print(f"fill rate with the notebook, new/old {result['fill_new_over_old']:.2f} "
          f"(goal >= 0.90): {goal_text(result['fill_new_over_old'] >= 0.9)}")
    print(f"worker busy after hang-up {new['abandoned_busy_steps']:.1f} steps (goal <= 1 step "
          f"+ the next request's own wait): {goal_text(new['abandoned_busy_steps'] <= 1.5)}")
    return finish(result, args.json)


if __name__ == "__main__":
    main(run)
