"""One SDXL bench's state and the ways it measures, for :mod:`bench.gpu.gpu_sdxl`.

:class:`Bench` holds the run (its arguments, device, deadline and results, the baseline's
drift images); :class:`ConfigRun` and :class:`Cell` are what one configuration and one
(configuration, batch) cell record. The measurements: a worker warmed per shape
(:func:`warm_up`), a probe of one warm batch (:func:`probe_seconds_per_image`), the service
started on a model with a configuration's options (:func:`serving`) and kept busy with two
requests in flight (:func:`saturate`), each request's options (:func:`generate_options`).

Example::

    with serving(bench, model, options, batch=8) as (live, ready_s):
        images_s = loop.run_until_complete(saturate(client, bench, 8, requests=4, seed=0))
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu._sdxl_model import build_sdxl, build_tiny

PROMPT = "a photograph of an astronaut riding a horse on the moon, detailed, 8k"
GUIDANCE = 5.0


@dataclass
class Cell:
    config: str
    batch: int
    direct_images_s: list[float] = field(default_factory=list)
    service_images_s: list[float] = field(default_factory=list)
    direct: float = float("nan")
    service: float = float("nan")
    ratio: float = float("nan")
    mfu_direct: float = float("nan")
    mfu_service: float = float("nan")
    peak_memory_gib: float = float("nan")
    failed_images: int = 0
    service_recompiles: float = 0.0
    graphs_compiled_while_measuring: int = 0
    service_ready_s: float = float("nan")  # start-up to /readyz 200: its warm-up included
    skipped: str | None = None
    speed: str = "quality"  # "turbo": requests with speed turbo, through HTTP only
    turbo: dict[str, Any] | None = None  # what /v1/info says turbo draws with


@dataclass
class ConfigRun:
    config: str
    options: dict[str, Any]
    build_s: float = 0.0
    apply_s: float = 0.0
    warmup_s: dict[str, float] = field(default_factory=dict)
    warmup_warm_cache_s: dict[str, float] = field(default_factory=dict)
    compiled_graphs: int = 0
    graph_breaks: int = 0
    drift: dict[str, Any] | None = None  # against the baseline of this run (same seeds)
    skipped: str | None = None
    turbo_lora: dict[str, Any] | None = None  # the synthetic turbo LoRA file written for it


@dataclass
class Bench:
    args: argparse.Namespace
    device: Any
    dtype: Any
    deadline: float
    results: dict[str, Any]
    # The baseline's drift images (uint8, the first config named "baseline" in this run).
    reference: list[Any] | None = None
    unet_config: dict[str, Any] | None = None  # the benchmarked UNet's (turbo LoRA shapes)
    work_dir: Path | None = None  # files a config writes (the turbo LoRA)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        if self.args.json is not None:
            self.args.json.write_text(json.dumps(self.results, indent=2, default=str))

    def key(self, steps: int | None = None) -> Any:
        from genaug.service.batching.items import GroupKey

        return GroupKey(self.args.size, self.args.size, steps or self.args.steps)

    def items(self, n: int, seed: int = 0) -> list[Any]:
        from genaug.service.batching.items import Item

        size = self.args.size
        return [
            Item(PROMPT, seed=seed + i, guidance=GUIDANCE, output_height=size, output_width=size)
            for i in range(n)
        ]

    def build(self) -> Any:
        if self.args.tiny:
            return build_tiny(self.device, self.dtype)
        return build_sdxl(self.device, self.dtype)

    def sync(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)


def release(device: Any) -> None:
    import torch

    gc.collect()
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def warm_up(bench: Bench, worker: Any, batches: Sequence[int]) -> dict[str, float]:
    """Seconds of the first batch of each shape (compilation included), WARMUP_STEPS steps."""
    from genaug.service.pipeline.warmup import WARMUP_STEPS

    out: dict[str, float] = {}
    for batch in batches:
        t0 = time.perf_counter()
        worker.run(bench.key(WARMUP_STEPS), bench.items(batch))
        bench.sync()
        out[f"{bench.args.size}x{bench.args.size}:{batch}"] = time.perf_counter() - t0
    return out


def probe_seconds_per_image(bench: Bench, worker: Any, batch: int) -> float:
    """A compiled-and-warm batch of WARMUP_STEPS steps, scaled to the bench's steps."""
    from genaug.service.pipeline.warmup import WARMUP_STEPS

    t0 = time.perf_counter()
    worker.run(bench.key(WARMUP_STEPS), bench.items(batch))
    bench.sync()
    return (time.perf_counter() - t0) / WARMUP_STEPS * bench.args.steps / batch


def service_settings(
    bench: Bench, options: Any, batch: int, turbo: tuple[Path, str] | None = None
) -> Any:
    """The benchmarked service's settings; ``turbo``: ``(file, kind)`` of a turbo LoRA
    (``GENAUG_TURBO_LORA``, ``GENAUG_TURBO_KIND``)."""
    from genaug.local_service import free_port
    from genaug.service.settings import Settings

    size = bench.args.size
    lora = {} if turbo is None else {"turbo_lora": turbo[0], "turbo_kind": turbo[1]}
    return Settings(
        port=free_port(),
        max_batch_images=batch,
        max_wait_ms=5,
        max_queue_images=4 * batch,
        max_n=max(64, batch),
        default_size=size,
        default_steps=bench.args.steps,
        default_guidance=GUIDANCE,
        request_timeout_s=3600,
        warmup=True,
        warmup_shapes=f"{size}x{size}:{batch}",
        log_level="warning",
        **lora,
        **options.as_dict(),
    )


@contextlib.contextmanager
def serving(
    bench: Bench, model: Any, options: Any, batch: int, turbo: tuple[Path, str] | None = None
) -> Iterator[tuple[Any, float]]:
    """The service on ``model``, and the seconds it took to be ready (its warm-up)."""
    from genaug.service.testing import start_service

    settings = service_settings(bench, options, batch, turbo)
    t0 = time.perf_counter()
    with start_service(model, settings=settings, record=False, ready_timeout=900) as live:
        yield live, time.perf_counter() - t0


def generate_options(bench: Bench, batch: int, seed: int, speed: str) -> dict[str, Any]:
    """One request's options: the bench's steps and guidance, or (``speed`` turbo) none, so
    the service draws with its turbo steps, scheduler and guidance."""
    size = bench.args.size
    options: dict[str, Any] = {"n": batch, "seed": seed, "height": size, "width": size,
                               "timeout_s": 3600}
    if speed == "turbo":
        return {**options, "speed": "turbo"}
    return {**options, "steps": bench.args.steps, "guidance": GUIDANCE}


async def saturate(
    client: Any, bench: Bench, batch: int, requests: int, seed: int, speed: str = "quality"
) -> float:
    """Images per second of ``requests`` requests of ``batch`` images, two in flight."""
    todo = list(range(requests))

    async def one() -> None:
        while todo:
            i = todo.pop()
            result = await client.generate(
                PROMPT, **generate_options(bench, batch, seed + 1000 * i, speed))
            assert len(result.images) == batch

    t0 = time.perf_counter()
    await asyncio.gather(one(), one())
    return requests * batch / (time.perf_counter() - t0)
