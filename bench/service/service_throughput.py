"""Service throughput at saturation vs. the same pipeline called in-process.

Service: ``python -m genaug.service`` in a child process, ``max_batch_images=B``; ``clients``
coroutines of one AsyncClient each ask for ``n=B`` images back to back, so a full batch always
waits. Direct: ``PipelineWorker(load_model(...)).run(key, items)`` in this process at batch size B.
Both use the same torch thread count (``--threads``, default 1; see ``bench.services``). Rounds
alternate direct / service; the ratio is taken per round, then the median.

    python -m bench.service.service_throughput [--quick]

Goal: service / direct >= 0.95.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from bench.harness import finish, goal_text, interleave, main, median, parse_args, table
from bench.services import Clients, pin_threads, service, tiny_model

GOAL = 0.95


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__ or "", argv)
    batch, clients, size, steps = 8, 4, 64, 4
    # Many short rounds: on a shared machine a neighbour's burst hits one short phase, and
    # the median of per-round ratios drops it.
    rounds = 3 if args.quick else 20
    batches_per_round = 2 if args.quick else 3

    from genaug.service.batching.items import GroupKey, Item
    from genaug.service.pipeline.worker import PipelineWorker

    pin_threads(args.threads)
    generator = PipelineWorker(tiny_model())
    key = GroupKey(height=size, width=size, steps=steps)
    generator.warmup(key, 5.0)

    def direct() -> float:
        started = time.perf_counter()
        for b in range(batches_per_round):
            items = [
                Item("depth image of a wound", seed=1000 * b + i, guidance=5.0,
                     output_height=size, output_width=size)
                for i in range(batch)
            ]
            generator.run(key, items)
        return batches_per_round * batch / (time.perf_counter() - started)

    with (
        service(threads=args.threads, max_batch_images=batch, max_wait_ms=10,
                max_queue_images=4096) as url,
        Clients({"service": url}, client_id="bench", timeout=120) as senders,
    ):

        def via_service() -> float:
            return senders.saturate("service", concurrency=clients, requests=batches_per_round,
                                    n=batch, height=size, width=size, steps=steps, guidance=5.0)

        via_service()  # first connections, first batches
        values = interleave(rounds, {"direct": direct, "service": via_service})

    ratios = [s / d for s, d in zip(values["service"], values["direct"], strict=True)]
    ratio = median(ratios)
    rows = [
        ["direct (in-process PipelineWorker.run)", median(values["direct"]), "1.00", ""],
        [
            f"service ({clients} async clients, n={batch})",
            median(values["service"]),
            ratio,
            f">= {GOAL} {goal_text(ratio >= GOAL)}",
        ],
    ]
    table(
        f"Service throughput at saturation: batch {batch}, {size}x{size}, {steps} steps, "
        f"{args.threads} torch thread(s), {rounds} rounds",
        ["path", "images/s (median)", "ratio vs direct", "goal"],
        rows,
    )
    print(f"per-round ratios: {', '.join(f'{r:.3f}' for r in ratios)}")
    return finish(
        {
            "benchmark": "service_throughput",
            "batch": batch,
            "clients": clients,
            "threads": args.threads,
            "rounds": rounds,
            "direct_images_s": values["direct"],
            "service_images_s": values["service"],
            "ratios": ratios,
            "ratio": ratio,
            "goal": GOAL,
            "met": ratio >= GOAL,
        },
        args.json,
    )


if __name__ == "__main__":
    main(run)
