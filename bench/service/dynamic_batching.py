"""Dynamic batching: 16 concurrent single-image clients, batches of up to 16 vs. batches of 1.

Four services run side by side, each in its own child process with the same torch thread
count, and rounds visit them in alternating order:

- ``per-image pipeline``: the default tiny pipeline (``build_tiny_pipeline(batch_invariant=True)``)
  runs the UNet, text encoders and VAE once per image so that an image never depends on its
  batch mates. Batching therefore cannot make the model itself faster; it only saves the
  per-call pipeline overhead (scheduler set-up, prompt handling, latents, one HTTP batch).
- ``batched pipeline``: the same weights built with ``batch_invariant=False`` (true batched
  tensors), which is how a real SDXL pipeline on a GPU behaves. The service has no setting for
  it, so ``bench.serve`` serves ``create_app`` with that model.

Each service is tried with ``max_batch_images=16, max_wait_ms=10`` and with
``max_batch_images=1``; the table reports images/s and the batching gain (16 / 1).

    python -m bench.service.dynamic_batching [--quick]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.harness import finish, interleave, main, median, parse_args, table
from bench.services import Clients, services

CLIENTS = 16
WAIT_MS = 10


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__ or "", argv)
    rounds = 2 if args.quick else 4
    images = 32 if args.quick else 96
    specs: dict[str, dict[str, Any]] = {}
    for pipe, invariant in (("per-image", True), ("batched", False)):
        for mb in (16, 1):
            specs[f"{pipe}/{mb}"] = {
                "batch_invariant": invariant,
                "max_batch_images": mb,
                "max_wait_ms": WAIT_MS,
                "max_queue_images": 4096,
            }

    with services(specs, threads=args.threads) as urls, Clients(urls, timeout=120) as clients:

        def phase(name: str) -> Any:
            def go() -> float:
                return clients.saturate(name, concurrency=CLIENTS, requests=images, n=1,
                                        height=64, width=64, steps=4, guidance=5.0)

            return go

        for name in urls:  # open the 16 connections and run first batches
            clients.saturate(name, concurrency=CLIENTS, requests=CLIENTS, n=1)
        values = interleave(rounds, {name: phase(name) for name in urls})

    rows = []
    result: dict[str, Any] = {
        "benchmark": "dynamic_batching",
        "clients": CLIENTS,
        "max_wait_ms": WAIT_MS,
        "rounds": rounds,
        "threads": args.threads,
        "images_s": values,
    }
    for pipe in ("per-image", "batched"):
        batched, single = values[f"{pipe}/16"], values[f"{pipe}/1"]
        gains = [b / s for b, s in zip(batched, single, strict=True)]
        gain = median(gains)
        result[f"gain_{pipe}"] = gain
        rows.append([f"{pipe} pipeline", median(batched), median(single), gain])
    table(
        f"Dynamic batching: {CLIENTS} concurrent n=1 clients, 64x64, 4 steps, "
        f"max_wait_ms={WAIT_MS}, {args.threads} torch thread(s), {rounds} rounds x {images} "
        "images",
        ["pipeline", "images/s, max_batch 16", "images/s, max_batch 1", "gain (16 / 1)"],
        rows,
    )
    return finish(result, args.json)


if __name__ == "__main__":
    main(run)
