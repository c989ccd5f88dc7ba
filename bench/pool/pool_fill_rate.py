"""Pool fill rate while idle vs. request throughput of the same service, same spec and batch.

One child-process service, a two-label recipe (64x64, 4 steps, no negative prompt),
``max_batch_images=8``, ``pregenerate=false`` so the pool only grows when asked. Rounds
alternate two phases against that one service:

- ``fill``: ``POST /v1/recipes/bench/fill`` raises every label's target by ``per_label`` (a
  multiple of 8, so every idle batch is full); the phase ends when ``GET /v1/recipes/bench``
  reports ``totals.generated`` grown by ``2 * per_label`` (polled every 10 ms after a quiet
  80% of the expected time, so polling barely disturbs the CPU pipeline). Rate = images
  added / time from the POST to that answer. It includes what only pre-generation pays:
  choosing a label (SQLite stats), planning, and writing the batch to SQLite in the worker
  thread.
- ``direct``: 4 AsyncClient coroutines ask ``/v1/generate`` for n=8 at the same size, steps
  and guidance until the same number of images came back (saturated: a full batch always
  waits). The pool's generated count is checked to stay constant, i.e. no idle work ran.

    python -m bench.pool.pool_fill_rate [--quick]

Goal: fill rate / direct >= 0.95.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness import finish, goal_text, interleave, main, median, parse_args, table
from bench.services import Clients, service, wait_generated, write_recipe

GOAL = 0.95
BATCH = 8


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__ or "", argv)
    import httpx

    per_label = 8 if args.quick else 48
    rounds = 3 if args.quick else 8
    labels = ("A", "B")
    images = per_label * len(labels)
    steps, size = 4, 64
    state = {"target": 0, "generated": 0}
    leaked: list[int] = []
    rates: list[float] = []

    with tempfile.TemporaryDirectory(prefix="genaug-bench-") as tmp:
        folder = Path(tmp)
        recipes = write_recipe(folder, labels=labels, steps=steps, size=size)
        with (
            service(
                threads=args.threads,
                recipes=recipes,
                pool_path=folder / "pool.db",
                pool_capacity_per_label=100_000,
                pregenerate=False,
                max_batch_images=BATCH,
                max_wait_ms=10,
                max_queue_images=4096,
            ) as url,
            httpx.Client(timeout=60) as http,
            Clients({"bench": url}, client_id="bench", timeout=120) as clients,
        ):

            def generated() -> int:
                return int(http.get(f"{url}/v1/recipes/bench").json()["totals"]["generated"])

            def fill() -> float:
                state["target"] += per_label
                goal = state["generated"] + images
                started = time.perf_counter()
                http.post(
                    f"{url}/v1/recipes/bench/fill", json={"per_label": state["target"]}
                ).raise_for_status()
                # Sleep through ~80% of the expected time (at the latest direct rate), then
                # poll every 10 ms.
                quiet = 0.8 * images / rates[-1] if rates else 0.0
                ended, detail = wait_generated(http, url, "bench", goal, quiet_s=quiet)
                state["generated"] = int(detail["totals"]["generated"])
                return (state["generated"] - goal + images) / (ended - started)

            def direct() -> float:
                before = generated()
                rate = clients.saturate("bench", concurrency=4, requests=images // BATCH,
                                        n=BATCH, height=size, width=size, steps=steps,
                                        guidance=5.0)
                leaked.append(generated() - before)
                rates.append(rate)
                return rate

            direct()  # connections, first batches, and a first rate for the quiet time
            fill()  # first pool writes: SQLite file growth, first label choice
            values = interleave(rounds, {"fill": fill, "direct": direct})

    ratios = [f / d for f, d in zip(values["fill"], values["direct"], strict=True)]
    ratio = median(ratios)
    table(
        f"Pool fill rate vs. /v1/generate throughput: batch {BATCH}, {size}x{size}, "
        f"{steps} steps, {args.threads} torch thread(s), {rounds} rounds x {images} images",
        ["phase", "images/s (median)", "ratio vs direct", "goal"],
        [
            ["direct (/v1/generate, 4 clients, n=8)", median(values["direct"]), "1.00", ""],
            [
                "fill (idle pre-generation)",
                median(values["fill"]),
                ratio,
                f">= {GOAL} {goal_text(ratio >= GOAL)}",
            ],
        ],
    )
    print(
        f"per-round ratios: {', '.join(f'{r:.3f}' for r in ratios)}; "
        f"pool images generated during direct phases: {sum(leaked)}"
    )
    return finish(
        {
            "benchmark": "pool_fill_rate",
            "batch": BATCH,
            "rounds": rounds,
            "threads": args.threads,
            "fill_images_s": values["fill"],
            "direct_images_s": values["direct"],
            "ratios": ratios,
            "ratio": ratio,
            "idle_images_during_direct": sum(leaked),
            "goal": GOAL,
            "met": ratio >= GOAL,
        },
        args.json,
    )


if __name__ == "__main__":
    main(run)
