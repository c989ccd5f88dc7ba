"""Mixed-guidance batching: 8 clients with their own guidance, one UNet call vs. one per guidance.

Eight concurrent clients each send n=1 requests (64x64, 4 steps) with a guidance of their own
(1.5, 2.5, ..., 8.5), as trainers with different recipes do. Two services run side by side,
each in its own child process with the same torch thread count, ``max_batch_images=8`` and
``max_wait_ms=10``, both on the truly batched tiny pipeline
(``build_tiny_pipeline(batch_invariant=False)``: the default tiny pipeline runs its modules
per image and cannot show batching gains), and rounds visit them in alternating order:

- ``mixed``: today's :class:`~genaug.service.pipeline.worker.PipelineWorker`. Guidance is applied
  per image inside genaug's sampler, so a batch of 8 is one UNet call of 16 rows per step.
- ``per guidance``: the behaviour before the sampler, emulated by replacing the worker's
  ``_denoise`` with the code it had: the batch is split by (guidance, negative prompt given)
  and each part is one ``StableDiffusionXLPipeline.__call__`` (``output_type="latent"``),
  followed, as before, by one VAE decode of the whole batch. With 8 guidance values that is
  8 calls of 2 UNet rows per step. The batcher, HTTP path and decode are the same code.

The table reports images/s of both and their ratio (median of the per-round ratios).

    python -m bench.service.mixed_guidance [--quick] [--threads N] [--json FILE]
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from bench.harness import finish, goal_text, interleave, main, median, parse_args, table
from bench.services import Clients, services

CLIENTS = 8
GUIDANCES = [1.5 + i for i in range(CLIENTS)]
WAIT_MS = 10
GOAL = 1.5
MODES = ("mixed", "per guidance")


# -- the emulated old worker ----------------------------------------------------------------


def per_guidance(worker: Any) -> Any:
    """``worker`` with the denoising of genaug before the sampler: one stock pipeline call per
    (guidance, negative prompt given) among the batch's items (the code it had, verbatim but
    for names)."""
    import torch

    def pipeline_call(key: Any, items: Sequence[Any], guidance: float, negative: bool) -> Any:
        generators = [
            torch.Generator(device=worker.device).manual_seed(item.seed) for item in items
        ]
        return worker.pipe(
            prompt=[item.prompt for item in items],
            negative_prompt=[item.negative_prompt or "" for item in items] if negative else None,
            height=key.height,
            width=key.width,
            num_inference_steps=key.steps,
            guidance_scale=guidance,
            generator=generators,
            output_type="latent",
            return_dict=True,
        ).images

    def denoise(key: Any, items: Sequence[Any]) -> Any:
        latents: list[Any] = [None] * len(items)
        groups: dict[tuple[float, bool], list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault((item.guidance, item.negative_prompt is not None), []).append(i)
        for (guidance, negative), indices in groups.items():
            out = pipeline_call(key, [items[i] for i in indices], guidance, negative)
            for i, row in zip(indices, out, strict=True):
                latents[i] = row
        return torch.stack(latents)

    worker._denoise = denoise
    return worker


# -- services -------------------------------------------------------------------------------

# Both on the truly batched tiny pipeline; "per guidance" with the old denoising swapped in
# (bench.serve imports this module in its child for that).
SPECS = {
    "mixed": {"batch_invariant": False},
    "per guidance": {"batch_invariant": False,
                     "wrap": "bench.service.mixed_guidance:per_guidance"},
}


# -- load -------------------------------------------------------------------------------------


async def clients_round(client: Any, per_client: int, base_seed: int) -> float:
    """Each of the 8 clients sends ``per_client`` n=1 requests with its own guidance, one
    after the other; images/s from the first send to the last answer."""

    async def one(c: int) -> None:
        for j in range(per_client):
            result = await client.generate(
                "depth image of a wound", n=1, seed=base_seed + 1000 * c + j, height=64,
                width=64, steps=4, guidance=GUIDANCES[c],
            )
            assert len(result) == 1

    started = time.perf_counter()
    await asyncio.gather(*(one(c) for c in range(CLIENTS)))
    return CLIENTS * per_client / (time.perf_counter() - started)


def batch_counts(url: str) -> tuple[float, float]:
    """(images, batches) the service's worker has run for requests so far."""
    from genaug.service.testing import read_metric

    labels = 'source="request"'
    return (read_metric(url, "genaug_batch_images_sum", labels),
            read_metric(url, "genaug_batch_images_count", labels))


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__ or "", argv)
    rounds = 2 if args.quick else 6
    per_client = 4 if args.quick else 12
    settings = {"max_batch_images": CLIENTS, "max_wait_ms": WAIT_MS, "max_queue_images": 4096}

    counter = iter(range(10**6))
    specs = {mode: {**SPECS[mode], **settings} for mode in MODES}
    with services(specs, threads=args.threads) as urls, Clients(urls, timeout=300) as clients:
        for mode in MODES:  # open the connections, run first batches
            clients.run(clients_round(clients[mode], 1, 0))

        def phase(mode: str) -> Any:
            def go() -> float:
                seed = 10**7 * (1 + next(counter))
                return clients.run(clients_round(clients[mode], per_client, seed))

            return go

        before = {mode: batch_counts(url) for mode, url in urls.items()}
        values = interleave(rounds, {mode: phase(mode) for mode in MODES})
        after = {mode: batch_counts(url) for mode, url in urls.items()}

    mean_batch = {
        mode: (after[mode][0] - before[mode][0]) / max(1.0, after[mode][1] - before[mode][1])
        for mode in MODES
    }
    ratios = [m / p for m, p in zip(values["mixed"], values["per guidance"], strict=True)]
    ratio = median(ratios)
    result: dict[str, Any] = {
        "benchmark": "mixed_guidance",
        "clients": CLIENTS,
        "guidances": GUIDANCES,
        "rounds": rounds,
        "images_per_round": CLIENTS * per_client,
        "threads": args.threads,
        "images_s": values,
        "ratios": ratios,
        "mean_batch_images": mean_batch,
        "ratio": ratio,
        "goal": GOAL,
        "met": ratio >= GOAL,
    }
    table(
        f"Mixed guidance: {CLIENTS} concurrent n=1 clients, guidance {GUIDANCES[0]:g} to "
        f"{GUIDANCES[-1]:g} (one per client), 64x64, 4 steps, max_batch_images={CLIENTS}, "
        f"max_wait_ms={WAIT_MS}, batched tiny pipeline, {args.threads} torch thread(s), "
        f"{rounds} rounds x {CLIENTS * per_client} images",
        ["batching", "images per batch (mean)", "images/s (median)", "ratio (median of rounds)",
         "goal", "met"],
        [
            ["per guidance (one pipeline call per guidance value)", mean_batch["per guidance"],
             median(values["per guidance"]), 1.0, "", ""],
            ["mixed (per-image guidance, one UNet call per step)", mean_batch["mixed"],
             median(values["mixed"]), ratio, f">= {GOAL}", goal_text(ratio >= GOAL)],
        ],
    )
    print(f"per-round ratios: {', '.join(f'{r:.2f}' for r in ratios)}", flush=True)
    return finish(result, args.json)


if __name__ == "__main__":
    main(run)
