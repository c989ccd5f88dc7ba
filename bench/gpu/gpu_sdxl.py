"""SDXL at full size, random weights: images/s, MFU, memory and warm-up per acceleration option.

Builds Stable Diffusion XL base 1.0 from its published configs (``bench/gpu/sdxl/*.json``,
transcribed: nothing is downloaded; :mod:`bench.gpu._sdxl_model`, which the other GPU scripts
share) with seeded random weights: the UNet (2,567,463,684
parameters), both text encoders (CLIP ViT-L/14 and OpenCLIP ViT-bigG/14 text towers), the
VAE, the Euler scheduler; the repo's byte-level tiny tokenizer stands in for CLIP's BPE (random
weights make every token equally meaningless). Then, per acceleration option
(``GENAUG_COMPILE``, ``GENAUG_CHANNELS_LAST``, ...: :mod:`genaug.service.pipeline.acceleration`),
per batch size, 1024x1024, 30 steps, guidance 5:

- *direct*: ``PipelineWorker.run(key, items)`` in this process, one batch of B images;
- *service*: the same model served by ``create_app`` under uvicorn in this process
  (``genaug.service.testing.start_service``, ``max_batch_images=B``), two async HTTP clients
  asking for n=B back to back;

interleaved (direct, service, service, direct, ...); images/s is the median per phase.

MFU (model FLOPs utilisation) = images/s x UNet FLOPs per image / measured matmul peak. UNet
FLOPs per pass are counted from the model, not estimated: ``torch.utils.flop_counter.
FlopCounterMode`` over one forward of the UNet built on the ``meta`` device (shapes only, no
memory, no arithmetic) at batch 1 and the benchmark's size (SDXL at 1024x1024: 6.761 TFLOP;
convolutions, linear layers and attention products, a multiply-add counted as 2). With
guidance each step runs the UNet on two latents (conditional and unconditional), so one image
costs 2 x steps x that (405.7 TFLOP for 30 steps); text encoders and the VAE are left out of
the count. The peak is a dense 8192^3 bf16 matmul timed with CUDA events on the same device
(median of 20; float32 on the CPU for ``--tiny``).

Image drift: after its warm-up each config makes the same :data:`DRIFT_IMAGES` images (the
same seeds, the bench's size and steps) and they are compared with the baseline's of the
same run: PSNR of the decoded uint8 images, and the share of images *visibly changed*, i.e.
with more than ``VISIBLE_SHARE`` (1 %) of their pixels differing by more than
``VISIBLE_LEVELS`` (8 of 255) in some channel (:func:`bench.gpu._sdxl_model.drift`).
Numerically equivalent options (compile, fused projections) stay near-identical; FP8 is where
a user decides.

The tables it prints, and each goal with whether it was met: :mod:`bench.gpu._sdxl_report`;
the bench's state and its ways of measuring (a warmed worker, a served model kept busy):
:mod:`bench.gpu._sdxl_bench`. This module plans the cells and runs each configuration.

Plans (each fits a 10-minute slot of a GPU queue; the first measures what matters most, two
more the rest)::

    python -m bench.gpu.gpu_sdxl                 # --plan first: baseline and best at batch
                                                 # 1, 8, then warm-up with a warm cache
    python -m bench.gpu.gpu_sdxl --plan sizes    # baseline and best at batch 4 and 16
    python -m bench.gpu.gpu_sdxl --plan options  # baseline, each option alone at batch 8
    python -m bench.gpu.gpu_sdxl --plan hopper   # today's best, then FP8, CUDA graphs and
                                                 # the attention kernel each added to it,
                                                 # and all (--new-best), at batch 1, 8, 16
    python -m bench.gpu.gpu_sdxl --plan speed    # baseline, best at batch 8, 16, turbo at
                                                 # 16, new best at 8, 16
    python -m bench.gpu.gpu_sdxl --tiny --quick  # the same code, tiny model, CPU (in CI)
    python -m bench.gpu.gpu_sdxl --configs baseline,compile=unet+channels_last --batches 8

On the GPU machine: ``bash bench/gpu/gpu_run.sh [--plan sizes|options|hopper]``
(docs/benchmarks.md, "GPU"; an offline box first gets the wheels it lacks,
:mod:`bench.gpu.gpu_wheels`).
``--budget-s`` stops before a cell that would not fit (default 530 s on CUDA) and every cell
is written to ``--json`` as soon as it is measured, so a command cut short keeps what it
measured.

Turbo (the ``turbo`` config, in ``--plan speed`` at batch 16): requests with ``"speed":
"turbo"``, through HTTP only, to a service started with ``GENAUG_TURBO_LORA`` (a synthetic
SDXL-size LoRA in the published layout of ``--turbo-kind``, default ``lcm``: 788 layers of
rank 64, written into the bench's work dir by :mod:`bench.gpu.turbo_lora_file`, in a child
process) and ``GENAUG_TURBO_KIND``, today's best options: the service fuses the LoRA into a
second UNet and draws with the kind's scheduler and guidance (LCM: none) in
``GENAUG_TURBO_STEPS`` steps (4). Its MFU counts one UNet pass per step (no guidance).

Goals (on an H100): the best combination at >= 0.70 images/s through HTTP (about 36 % MFU
against ~790 TFLOP/s), service >= 0.95 of in-process; with FP8, CUDA graphs and the fastest
attention (``--plan hopper``) >= 1.4 images/s, beyond NVIDIA's TensorRT SDXL (MLPerf
Inference v4.1, 2.05 images/s at 20 steps: ~1.36 at 30); speed turbo (4 steps, no guidance)
>= 10 images/s at batch 16.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.gpu._sdxl_bench import (
    GUIDANCE,
    Bench,
    Cell,
    ConfigRun,
    probe_seconds_per_image,
    release,
    saturate,
    serving,
    warm_up,
)
from bench.gpu._sdxl_model import (
    build_tiny,
    count_unet_flops,
    drift,
    dynamo_counts,
    load_config,
    matmul_peak,
    parameter_counts,
    parameter_counts_sdxl,
    versions,
)
from bench.gpu._sdxl_report import (
    flops_text,
    report,
)
from bench.harness import main, median

#: The turbo config: today's best options, requests with speed turbo to a service serving a
#: turbo LoRA (``turbo+<options>`` names other options).
TURBO = "turbo"
TURBO_STEPS = 4  # GENAUG_TURBO_STEPS' default with a turbo LoRA, if /v1/info does not say
TURBO_REQUESTS = 4  # requests of n=batch per measured phase (2 in flight)
TURBO_CELL_S = 120.0  # a turbo cell at most: a service start with its turbo UNet, the requests
BEST = "compile=regional+fuse_qkv"  # H100, 2026-11-25: channels_last cost 9 % at batch 8
# Everything new at once; not measured yet (--new-best changes it). Whole-UNet compile with
# max-autotune: CUDA graphs of the whole step and tuned FP8 kernels.
NEW_BEST = "compile=unet+compile_mode=max-autotune+fuse_qkv+quantize=fp8+attention=auto"
# Each new option added to today's best, alone ("best+..." expands BEST).
HOPPER_ADDED = (
    "best+attention=auto",
    "best+quantize=fp8",
    "best+quantize=fp8-conv",  # the convolutions too: whether they pay is what this measures
    "compile=unet+compile_mode=reduce-overhead+fuse_qkv",  # CUDA graphs: whole UNet only
    "compile=unet+compile_mode=max-autotune+fuse_qkv",
)
#: Image drift (docs/benchmarks.md): images per config, compared seed by seed with the
#: baseline's (:func:`~bench.gpu._sdxl_model.drift`).
DRIFT_IMAGES = 8  # one batch of 8: a size every plan but "sizes" has compiled
DRIFT_SEED = 424_242
# Shortest warm-up first: a whole-UNet compile may not fit what is left of a command.
SINGLES = (
    "channels_last",
    "fuse_qkv",
    "vae_slicing",
    "vae_tiling",  # a no-op at 1024 px for SDXL (its VAE tiles only above its 1024 sample size)
    "compile=regional",
    "compile=unet",
    "attention=auto",
    "quantize=fp8",
    "compile=unet+compile_mode=reduce-overhead",
)
GIB = 1024**3
# What "Model and device" lists of versions() (docs/benchmarks.md records them).



# -- arguments ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from genaug.service.sampling.modes import TURBO_KINDS  # a leaf: no torch

    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--tiny", action="store_true", help="tiny model on the CPU (CI)")
    p.add_argument("--quick", action="store_true", help="fewest rounds and steps")
    p.add_argument("--plan", choices=("first", "sizes", "options", "hopper", "speed", "all"),
                   default="first",
                   help="first: baseline and best at batch 1 and 8, warm-cache warm-up; "
                   "sizes: both at 4 and 16; options: baseline and each option alone at 8; "
                   "hopper: best, each new option added to it, and the new best, at 1, 8, 16; "
                   "speed: baseline and best at 8 and 16, turbo (speed turbo with a "
                   "synthetic turbo LoRA, through HTTP) at 16, new best at 8 and 16")
    p.add_argument("--configs", default=None,
                   help="comma-separated configs, options joined by '+' "
                   "(baseline, fuse_qkv, compile=regional+channels_last, best, turbo)")
    p.add_argument("--turbo-kind", choices=tuple(TURBO_KINDS), default="lcm",
                   help="the published layout of the turbo config's synthetic LoRA (lcm)")
    p.add_argument("--batches", default=None, help="comma-separated batch sizes for --configs")
    p.add_argument("--best", default=BEST, help=f"the best combination (default {BEST})")
    p.add_argument("--new-best", default=NEW_BEST,
                   help=f"everything new at once, 'new-best' in --configs (default {NEW_BEST})")
    p.add_argument("--drift-images", type=int, default=None,
                   help=f"images per config compared with the baseline's, one batch "
                   f"({DRIFT_IMAGES}; tiny 2; 0: no drift)")
    p.add_argument("--size", type=int, default=None, help="generation size (1024; tiny 64)")
    p.add_argument("--steps", type=int, default=None, help="steps (30; tiny --quick 4)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds per cell")
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--dtype", default=None, help="bfloat16 (CUDA default) or float32")
    p.add_argument("--threads", type=int, default=1, help="torch threads on the CPU")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop before a cell that would end later (default 530 on CUDA)")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="TorchInductor cache (default: a fresh one, so compiles start cold)")
    p.add_argument("--no-cache-check", action="store_true",
                   help="skip the warm-cache warm-up (a child process)")
    p.add_argument("--warmup-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args(argv)
    args.size = args.size or (64 if args.tiny else 1024)
    args.steps = args.steps or (4 if args.tiny and args.quick else 30)
    args.rounds = args.rounds or (1 if args.quick else 2)
    if args.drift_images is None:
        args.drift_images = 2 if args.tiny else DRIFT_IMAGES
    return args


def options_of(spec: str, best: str, new_best: str = NEW_BEST) -> Any:
    """A config's options: options joined by ``+``; ``best`` and ``new-best`` stand for
    those combinations (``best+quantize=fp8``: today's best with FP8)."""
    from genaug.service.pipeline.acceleration_options import AccelerationOptions

    names = {"best": best, "new-best": new_best}
    parts = [names.get(part.strip(), part.strip()) for part in spec.strip().split("+")]
    if parts[0] == TURBO:  # the turbo config: today's best unless it names its own options
        parts = parts[1:] or [best]
    return AccelerationOptions.parse("+".join(parts).replace("+", ","))


def plan_cells(args: argparse.Namespace) -> list[tuple[str, list[int]]]:
    """(config, batch sizes) in the order they are measured.

    Each plan measures the baseline too, so its speed-ups are taken within one run. On an
    H100 each takes 6-9 minutes (one device command); ``all`` is the three in one process.
    """
    if args.configs:
        batches = [int(b) for b in (args.batches or "1,8").split(",")]
        return [(c.strip(), batches) for c in args.configs.split(",") if c.strip()]
    small, large = ([1, 2], [4, 8]) if args.tiny else ([1, 8], [4, 16])
    three = [1, 2, 4] if args.tiny else [1, 8, 16]
    plans = {
        "first": [("baseline", small), ("best", small)],
        "sizes": [("baseline", large), ("best", large)],
        "options": [("baseline", small[1:]), *((single, small[1:]) for single in SINGLES)],
        # The baseline only for the drift reference and the MFU's bf16 anchor, at batch 8.
        "hopper": [("baseline", small[1:]), ("best", three),
                   *((added, small[1:]) for added in HOPPER_ADDED), ("new-best", three)],
        # The three that matter at the batches a trainer's service runs, and speed turbo
        # (its compile cache the best's): one command.
        "speed": [("baseline", large[1:] if args.tiny else [8, 16]),
                  ("best", large[1:] if args.tiny else [8, 16]),
                  (TURBO, large[1:] if args.tiny else [16]),
                  ("new-best", large[1:] if args.tiny else [8, 16])],
        "all": [("baseline", small + large), ("best", small + large),
                *((single, small[1:]) for single in SINGLES)],
    }
    return plans[args.plan]


def measure_cell(
    bench: Bench, model: Any, worker: Any, options: Any, config: str, batch: int,
    flops_per_image: float, peak: float, *, minimal: bool = False,
) -> Cell:
    """One (config, batch) cell: direct and through HTTP, interleaved, ``--rounds`` rounds;
    ``minimal``: one round of one batch each (a config whose compile was paid for, measured
    at least that much before the time budget skips anything)."""
    import torch

    from genaug.client import AsyncClient

    cell = Cell(config=config, batch=batch)
    batches_per_phase = max(1, 4 // batch) if not (bench.args.quick or minimal) else 1
    rounds = 1 if minimal else bench.args.rounds
    if bench.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(bench.device)

    def direct(round_: int) -> float:
        t0 = time.perf_counter()
        for k in range(batches_per_phase):
            out = worker.run(bench.key(), bench.items(batch, seed=10_000 * round_ + 100 * k))
            cell.failed_images += len(out.errors)
        bench.sync()
        return batches_per_phase * batch / (time.perf_counter() - t0)

    with serving(bench, model, options, batch) as (live, ready_s):
        cell.service_ready_s = ready_s
        graphs_before, _ = dynamo_counts()
        loop = asyncio.new_event_loop()
        client = AsyncClient(live.url, client_id="bench", timeout=3600)
        try:
            for r in range(rounds):
                phases = [("direct", direct), ("service", None)]
                for name, _ in phases if r % 2 == 0 else phases[::-1]:
                    if name == "direct":
                        cell.direct_images_s.append(direct(r))
                    else:
                        cell.service_images_s.append(loop.run_until_complete(
                            saturate(client, bench, batch, batches_per_phase, 10_000 * r)
                        ))
        finally:
            loop.run_until_complete(client.aclose())
            loop.close()
        cell.service_recompiles = live.metric("genaug_recompiles_total")
        # Both paths must run what warm-up compiled: a graph compiled here would be timed.
        cell.graphs_compiled_while_measuring = dynamo_counts()[0] - graphs_before
    if bench.device.type == "cuda":
        cell.peak_memory_gib = torch.cuda.max_memory_allocated(bench.device) / GIB
    cell.direct = median(cell.direct_images_s)
    cell.service = median(cell.service_images_s)
    ratios = [s / d for s, d in zip(cell.service_images_s, cell.direct_images_s, strict=True)]
    cell.ratio = median(ratios)
    cell.mfu_direct = cell.direct * flops_per_image / peak
    cell.mfu_service = cell.service * flops_per_image / peak
    return cell


def run_config(
    bench: Bench, config: str, batches: list[int], flops_per_image: float, peak: float
) -> None:
    from genaug.service.pipeline.acceleration import apply_acceleration
    from genaug.service.pipeline.worker import PipelineWorker

    options = options_of(config, bench.args.best, bench.args.new_best)
    named = config.split("+", 1)[0] in ("best", "new-best")
    run = ConfigRun(config=config + (f" ({options.label})" if named else "")
                    if named else options.label, options=options.as_dict())
    bench.results["configs"].append(asdict(run))
    # What a build and a cold warm-up take at most on an H100 (whole-UNet compiles are long,
    # max-autotune's kernel tuning longer).
    needed = {"off": 60, "regional": 150, "unet": 300}[options.compile]
    needed += 240 if options.compile_mode.startswith("max-autotune") else 0
    if not bench.args.tiny and bench.remaining() < needed:
        run.skipped = f"time budget ({bench.remaining():.0f} s left, {needed} s needed)"
        bench.results["configs"][-1] = asdict(run)
        bench.save()
        return
    graphs0, breaks0 = dynamo_counts()
    try:
        t0 = time.perf_counter()
        model = bench.build()
        bench.sync()
        run.build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        apply_acceleration(model, options)
        run.apply_s = time.perf_counter() - t0
        worker = PipelineWorker(model)
        run.warmup_s = warm_up(bench, worker, batches)
        run.drift = measure_drift(bench, worker, is_baseline=config == "baseline")
    except Exception as exc:  # e.g. out of memory: report it and go on with the next config
        run.skipped = f"error: {type(exc).__name__}: {exc}"
        print(f"[{config}] failed: {run.skipped}", flush=True)
        bench.results["configs"][-1] = asdict(run)
        bench.save()
        release(bench.device)
        return
    graphs1, breaks1 = dynamo_counts()
    run.compiled_graphs, run.graph_breaks = graphs1 - graphs0, breaks1 - breaks0
    bench.results["configs"][-1] = asdict(run)
    bench.save()
    print(f"[{config}] built in {run.build_s:.1f} s, warm-up {run.warmup_s} "
          f"({run.compiled_graphs} graphs, {run.graph_breaks} graph breaks)", flush=True)
    for index, batch in enumerate(batches):
        per_image = probe_seconds_per_image(bench, worker, batch)
        images = 2 * bench.args.rounds * max(batch, 4 if not bench.args.quick else batch)
        estimate = (images + 2) * per_image + 15  # + the service's own warm-up, start, stop
        # Its compile was paid for: the config's first cell is measured, one batch each way
        # at least, before the budget may skip anything.
        minimal = index == 0 and bench.remaining() < estimate
        if bench.remaining() < estimate and not minimal:
            cell = Cell(config=run.config, batch=batch, skipped=f"time budget ({estimate:.0f} s)")
        else:
            try:
                cell = measure_cell(bench, model, worker, options, run.config, batch,
                                    flops_per_image, peak, minimal=minimal)
            except Exception as exc:  # keep measuring the other cells; the error is reported
                cell = Cell(config=run.config, batch=batch,
                            skipped=f"error: {type(exc).__name__}: {exc}")
        bench.results["cells"].append(asdict(cell))
        bench.save()
        print(f"[{config}] batch {batch}: direct {cell.direct:.3g} images/s, service "
              f"{cell.service:.3g}, ratio {cell.ratio:.3f}, MFU {cell.mfu_service:.1%}"
              + (f" (skipped: {cell.skipped})" if cell.skipped else ""), flush=True)
    del worker, model
    release(bench.device)


def write_turbo_lora_file(bench: Bench, kind: str) -> tuple[Path, dict[str, Any]]:
    """A synthetic turbo LoRA for the benchmarked UNet in ``kind``'s published layout, written
    into the bench's work dir by :mod:`bench.gpu.turbo_lora_file` in a child process (a GPU
    script imports no other); returns the file and what the writer reported."""
    from bench.gpu._sdxl_model import CONFIG_DIR

    assert bench.work_dir is not None
    out = bench.work_dir / f"turbo-{kind}.safetensors"
    report = bench.work_dir / f"turbo-{kind}.json"
    config = CONFIG_DIR / "unet.json"
    if bench.args.tiny:  # the tiny UNet's config, as the run read it
        config = bench.work_dir / "tiny-unet.json"
        config.write_text(json.dumps(bench.unet_config, default=list))
    cmd = [sys.executable, *(["-P"] if sys.flags.safe_path else []),  # as this process
           "-m", "bench.gpu.turbo_lora_file", "--kind", kind, "--out", str(out),
           "--config", str(config), "--json", str(report)]
    subprocess.run(cmd, check=True, timeout=max(60.0, bench.remaining()),
                   stdout=subprocess.DEVNULL)
    written: dict[str, Any] = json.loads(report.read_text())
    return out, written


def measure_turbo_cell(
    bench: Bench, model: Any, options: Any, config: str, batch: int, lora: tuple[Path, str],
    flops_per_pass: float, peak: float, *, minimal: bool = False,
) -> Cell:
    """One turbo cell: the service serving the turbo LoRA ``lora`` (file, kind), requests of
    n=``batch`` with speed turbo, ``TURBO_REQUESTS`` per phase (two in flight), after one
    untimed request (the turbo UNet's first batch of the shape: its compile, should the
    service's warm-up have left it out)."""
    import torch

    from genaug.client import AsyncClient

    cell = Cell(config=config, batch=batch, speed="turbo")
    requests = 1 if (bench.args.quick or minimal) else TURBO_REQUESTS
    rounds = 1 if minimal else bench.args.rounds
    if bench.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(bench.device)
    with serving(bench, model, options, batch, turbo=lora) as (live, ready_s):
        cell.service_ready_s = ready_s
        loop = asyncio.new_event_loop()
        client = AsyncClient(live.url, client_id="bench", timeout=3600)
        try:
            cell.turbo = loop.run_until_complete(client.info()).get("turbo")
            loop.run_until_complete(saturate(client, bench, batch, 1, 7, speed="turbo"))
            graphs_before, _ = dynamo_counts()
            for r in range(rounds):
                cell.service_images_s.append(loop.run_until_complete(
                    saturate(client, bench, batch, requests, 10_000 * r, speed="turbo")))
        finally:
            loop.run_until_complete(client.aclose())
            loop.close()
        cell.service_recompiles = live.metric("genaug_recompiles_total")
        cell.graphs_compiled_while_measuring = dynamo_counts()[0] - graphs_before
    if bench.device.type == "cuda":
        cell.peak_memory_gib = torch.cuda.max_memory_allocated(bench.device) / GIB
    cell.service = median(cell.service_images_s)
    turbo = cell.turbo or {}
    passes = int(turbo.get("steps", TURBO_STEPS)) * (2 if turbo.get("guidance", 0) > 1 else 1)
    cell.mfu_service = cell.service * passes * flops_per_pass / peak
    return cell


def run_turbo(
    bench: Bench, config: str, batches: list[int], flops_per_pass: float, peak: float
) -> None:
    """The turbo config: a synthetic turbo LoRA written, a fresh model served with it, speed
    turbo through HTTP at each batch size (no in-process path: the service makes the turbo
    UNet)."""
    kind = bench.args.turbo_kind
    options = options_of(config, bench.args.best, bench.args.new_best)
    run = ConfigRun(config=f"{config} ({kind} LoRA, {options.label})",
                    options=options.as_dict())
    bench.results["configs"].append(asdict(run))
    # The LoRA written (a 394 MB file), the model built, the turbo UNet fused and compiled.
    needed = 60 + {"off": 60, "regional": 150, "unet": 300}[options.compile]
    needed += 240 if options.compile_mode.startswith("max-autotune") else 0
    if not bench.args.tiny and bench.remaining() < needed:
        run.skipped = f"time budget ({bench.remaining():.0f} s left, {needed} s needed)"
        bench.results["configs"][-1] = asdict(run)
        bench.save()
        return
    path: Path | None = None
    try:
        t0 = time.perf_counter()
        path, run.turbo_lora = write_turbo_lora_file(bench, kind)
        model = bench.build()
        bench.sync()
        run.build_s = time.perf_counter() - t0
    except Exception as exc:  # report it and go on with the next config
        run.skipped = f"error: {type(exc).__name__}: {exc}"
        print(f"[{config}] failed: {run.skipped}", flush=True)
        bench.results["configs"][-1] = asdict(run)
        bench.save()
        release(bench.device)
        return
    bench.results["configs"][-1] = asdict(run)
    bench.save()
    print(f"[{config}] {run.turbo_lora['layers']} {kind} LoRA layers written and the model "
          f"built in {run.build_s:.1f} s", flush=True)
    for index, batch in enumerate(batches):
        # A service start (its turbo UNet fused and warmed up) and the requests, at most.
        short = not bench.args.tiny and bench.remaining() < TURBO_CELL_S
        if short and index > 0:
            cell = Cell(config=run.config, batch=batch, speed="turbo",
                        skipped=f"time budget ({TURBO_CELL_S:.0f} s)")
        else:
            try:  # the first cell is measured, one request each way at least (minimal)
                cell = measure_turbo_cell(bench, model, options, run.config, batch,
                                          (path, kind), flops_per_pass, peak, minimal=short)
            except Exception as exc:  # keep measuring the other cells; the error is reported
                cell = Cell(config=run.config, batch=batch, speed="turbo",
                            skipped=f"error: {type(exc).__name__}: {exc}")
        bench.results["cells"].append(asdict(cell))
        bench.save()
        print(f"[{config}] batch {batch}: service {cell.service:.3g} images/s with speed "
              f"turbo ({cell.turbo}), MFU {cell.mfu_service:.1%}"
              + (f" (skipped: {cell.skipped})" if cell.skipped else ""), flush=True)
    del model
    path.unlink(missing_ok=True)
    release(bench.device)


def measure_drift(bench: Bench, worker: Any, *, is_baseline: bool) -> dict[str, Any] | None:
    """Make the drift images; the baseline's become the reference, the others are compared
    with it (``None`` without a baseline earlier in this run, or with ``--drift-images 0``).

    One batch of ``--drift-images`` images, the same batch for every config (on a GPU an
    image is reproducible per seed only up to floating-point noise between batch sizes).
    """
    n = bench.args.drift_images
    if n <= 0 or (not is_baseline and bench.reference is None):
        return None
    images = list(worker.run(bench.key(), bench.items(n, seed=DRIFT_SEED)).images)
    if is_baseline:
        if bench.reference is None:
            bench.reference = images
        return drift(bench.reference, images)
    assert bench.reference is not None
    return drift(bench.reference, images)


def warm_cache_check(bench: Bench, batches: list[int], cache_dir: Path) -> dict[str, Any]:
    """Warm-up of the best combination in a new process with this run's compile cache."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "warm.json"
        cmd = [
            sys.executable, *(["-P"] if sys.flags.safe_path else []),  # as this process: gpu_run.sh
            "-m", "bench.gpu.gpu_sdxl", "--warmup-only",
            "--configs", "best", "--best", bench.args.best, "--new-best", bench.args.new_best,
            "--batches", ",".join(str(b) for b in batches),
            "--size", str(bench.args.size), "--steps", str(bench.args.steps),
            "--threads", str(bench.args.threads), "--cache-dir", str(cache_dir),
            "--json", str(out),
        ]
        if bench.args.tiny:
            cmd.append("--tiny")
        if bench.args.device:
            cmd += ["--device", bench.args.device]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, timeout=max(60.0, bench.remaining()))
        result: dict[str, Any] = json.loads(out.read_text())
        result["process_s"] = time.perf_counter() - t0
        return result


def warmup_only(bench: Bench) -> dict[str, Any]:
    from genaug.service.pipeline.acceleration import apply_acceleration
    from genaug.service.pipeline.worker import PipelineWorker

    options = options_of("best", bench.args.best)
    batches = [int(b) for b in (bench.args.batches or "1").split(",")]
    t0 = time.perf_counter()
    model = bench.build()
    bench.sync()
    build_s = time.perf_counter() - t0
    apply_acceleration(model, options)
    return {"build_s": build_s,
            "warmup_s": warm_up(bench, PipelineWorker(model), batches)}


# -- report ---------------------------------------------------------------------------------


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    started = time.monotonic()
    cache_dir = args.cache_dir or Path(tempfile.mkdtemp(prefix="genaug-inductor-"))
    # Read by TorchInductor when it first compiles: set before anything is compiled.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    import diffusers
    import torch

    # "modules that should be kept in float32: []" on every cast of a built model.
    diffusers.utils.logging.set_verbosity_error()

    if args.tiny or args.device == "cpu":
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.tiny
                                          else "cpu"))
    if device.type != "cuda" and not args.tiny:
        raise SystemExit("no CUDA device: full-size SDXL needs a GPU; use --tiny on a CPU")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    budget = args.budget_s if args.budget_s is not None else (
        530.0 if device.type == "cuda" else float("inf"))
    results: dict[str, Any] = {"benchmark": "gpu_sdxl", "tiny": args.tiny}
    bench = Bench(args, device, dtype, started + budget, results)

    if args.warmup_only:
        results.update(warmup_only(bench))
        bench.save()
        return results

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (
        f"CPU ({platform.machine()}, {args.threads} torch thread(s))")
    if args.tiny:
        tiny = build_tiny(torch.device("cpu"), torch.float32).pipeline
        unet_config, parameters = dict(tiny.unet.config), parameter_counts(tiny)
        del tiny
    else:
        unet_config, parameters = load_config("unet"), parameter_counts_sdxl()
    t0 = time.perf_counter()
    flops = count_unet_flops(unet_config, args.size, args.size)
    flop_count_s = time.perf_counter() - t0
    flops_per_image = 2.0 * args.steps * flops
    peak = matmul_peak(device, dtype, quick=args.quick)
    bench.unet_config = unet_config
    bench.work_dir = Path(tempfile.mkdtemp(prefix="genaug-gpu-sdxl-"))
    results.update(
        device={"name": name, "type": device.type, "dtype": str(dtype).removeprefix("torch."),
                "matmul_peak": peak, **versions(device)},
        model={"size": args.size, "steps": args.steps, "guidance": GUIDANCE,
               "unet_flops_per_pass": flops, "flop_count_s": flop_count_s,
               "flops_per_image": flops_per_image, "parameters": parameters},
        configs=[], cells=[], cache_dir=str(cache_dir), work_dir=str(bench.work_dir),
    )
    print(f"{name}: UNet {flops_text(flops)} per pass at {args.size}x{args.size} "
          f"(counted in {flop_count_s:.1f} s), matmul peak {flops_text(peak, per_s=True)}",
          flush=True)
    bench.save()

    plan = plan_cells(args)
    for config, batches in plan:
        if config.split("+", 1)[0].strip() == TURBO:
            run_turbo(bench, config, batches, flops, peak)
        else:
            run_config(bench, config, batches, flops_per_image, peak)
    best_run = next((r for r in results["configs"]
                     if r["config"].split(" ", 1)[0] == "best" and r["warmup_s"]), None)
    if (best_run is not None and options_of("best", args.best).compile != "off"
            and not args.no_cache_check and bench.remaining() > 120):
        shapes = [int(s.rsplit(":", 1)[1]) for s in best_run["warmup_s"]]
        warm = warm_cache_check(bench, shapes, cache_dir)
        best_run["warmup_warm_cache_s"] = warm["warmup_s"]
        best_run["warm_cache_build_s"] = warm["build_s"]
    bench.save()
    report(results)
    return results



if __name__ == "__main__":
    main(run)
