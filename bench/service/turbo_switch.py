"""What serving a turbo LoRA beside the full sampler costs: memory, and switching modes.

The design (docs/turbo.md): the turbo LoRA fused into a second copy of the UNet, each batch
running the copy its key's speed names. In one process, the tiny model with a synthetic LCM
turbo LoRA (``bench/gpu/turbo_lora_file.py``, the tiny UNet's shapes):

- **memory**: the bytes of the fused copy's parameters beside the first UNet's, and for SDXL
  the same count from its UNet config (built on the meta device: no weights made);
- **switch cost**: batches of 8 alternating quality, turbo, quality, ... against the same
  batches grouped (all quality, then all turbo), the same keys, interleaved rounds: the ratio
  of the time per batch. A mode switch moves no weight and compiles nothing, so the goal is a
  ratio near 1.

    python -m bench.service.turbo_switch [--quick]

Goal: alternating / grouped <= 1.05.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness import ROOT, finish, goal_text, interleave, main, median, parse_args, table
from bench.services import pin_threads, tiny_model

GOAL = 1.05
BATCH = 8


def sdxl_unet_bytes() -> int:
    """The SDXL UNet's parameter bytes in bfloat16, counted on the meta device."""
    import torch
    from accelerate import init_empty_weights
    from diffusers import UNet2DConditionModel

    config = json.loads((ROOT / "bench" / "gpu" / "sdxl" / "unet.json").read_text())
    with init_empty_weights():
        unet = UNet2DConditionModel.from_config(config)
    return int(sum(p.numel() for p in unet.parameters()) * torch.finfo(torch.bfloat16).bits // 8)


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__ or "", argv)
    pin_threads(args.threads)
    from bench.gpu.turbo_lora_file import write_turbo_lora
    from genaug.service.batching.items import GroupKey, Item
    from genaug.service.pipeline.worker import PipelineWorker
    from genaug.service.settings import Settings

    rounds = 2 if args.quick else 6
    batches = 4 if args.quick else 12
    model = tiny_model()
    pipe = model.pipeline
    with tempfile.TemporaryDirectory(prefix="genaug-bench-") as tmp:
        lora = write_turbo_lora(Path(tmp) / "lcm.safetensors", "lcm", dict(pipe.unet.config),
                                rank=8)
        from genaug.service.pipeline.turbo_unet import attach_turbo, served_turbo

        turbo = served_turbo(Settings(model="tiny-random", turbo_lora=lora, turbo_kind="lcm"))
        attach_turbo(model, turbo)
    assert turbo is not None
    worker = PipelineWorker(model, turbo=turbo)
    copy = model.state.turbo_unet
    first_bytes = sum(p.numel() * p.element_size() for p in pipe.unet.parameters())
    copy_bytes = sum(p.numel() * p.element_size() for p in copy.parameters())
    drawn = turbo.sampling
    keys = {"quality": GroupKey(64, 64, drawn.steps, scheduler=drawn.scheduler),
            "turbo": GroupKey(64, 64, drawn.steps, scheduler=drawn.scheduler, speed="turbo")}
    items = [Item("depth image of a wound, class P", seed=s, guidance=drawn.guidance,
                  output_height=64, output_width=64) for s in range(BATCH)]

    def batch(mode: str) -> None:
        worker.run(keys[mode], items)

    for mode in keys:  # lazy initialisation out of the timing
        batch(mode)

    def alternating() -> float:
        started = time.perf_counter()
        for i in range(batches):
            batch("quality" if i % 2 == 0 else "turbo")
        return (time.perf_counter() - started) / batches

    def grouped() -> float:
        started = time.perf_counter()
        for i in range(batches):
            batch("quality" if i < batches // 2 else "turbo")
        return (time.perf_counter() - started) / batches

    times = interleave(rounds, {"alternating": alternating, "grouped": grouped})
    ratio = median(times["alternating"]) / median(times["grouped"])
    sdxl = sdxl_unet_bytes()
    table("A turbo LoRA served beside the full sampler (tiny model, batch 8, "
          f"{drawn.steps} steps; median of {rounds} interleaved rounds of {batches} batches)",
          ["", "value"],
          [["first UNet (tiny, float32)", f"{first_bytes / 2**20:.1f} MiB"],
           ["turbo copy (tiny, float32)", f"{copy_bytes / 2**20:.1f} MiB"],
           ["turbo copy at SDXL size, bfloat16", f"{sdxl / 1e9:.2f} GB"],
           ["s per batch, modes alternating", f"{median(times['alternating']):.3f}"],
           ["s per batch, modes grouped", f"{median(times['grouped']):.3f}"],
           ["alternating / grouped", f"{ratio:.3f}"]])
    met = ratio <= GOAL
    print(f"goal alternating / grouped <= {GOAL}: {goal_text(met)}")
    return finish({"first_unet_bytes": first_bytes, "turbo_copy_bytes": copy_bytes,
                   "sdxl_turbo_copy_bytes_bf16": sdxl, "times": times, "ratio": ratio,
                   "met": met}, args.json)


if __name__ == "__main__":
    main(run)
