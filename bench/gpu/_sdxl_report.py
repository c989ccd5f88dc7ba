"""What ``bench.gpu.gpu_sdxl`` prints: the model, device and version table, a table per
cell (direct against service, MFU, memory, warm-up), the turbo cells, and each goal with
whether it was met."""

from __future__ import annotations

from typing import Any

from bench.gpu._sdxl_model import VISIBLE_LEVELS, VISIBLE_SHARE
from bench.harness import table

GOAL_IMAGES_S = 0.70
GOAL_HOPPER_IMAGES_S = 1.4  # with FP8, CUDA graphs and the fastest attention (--plan hopper)
GOAL_RATIO = 0.95
GOAL_TURBO_IMAGES_S = 10.0  # per H100: speed turbo, 4 steps, no guidance, batch 16, HTTP
VERSION_KEYS = ("python", "torch", "cuda", "cudnn", "diffusers", "torchao", "driver",
                "compute_capability")


def flops_text(value: float, per_s: bool = False) -> str:
    """``6.761 TFLOP``, ``0.83 GFLOP/s``: the unit that keeps 1-999 before the point."""
    unit = "FLOP/s" if per_s else "FLOP"
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if abs(value) >= scale:
            return f"{value / scale:.4g} {prefix}{unit}"
    return f"{value:.4g} {unit}"



def gib_text(value: float) -> str:
    return "-" if value != value else f"{value:.1f}"  # NaN: not measured (CPU)


def report(results: dict[str, Any]) -> None:
    m = results["model"]
    table(
        f"Model and device: {results['device']['name']}",
        ["what", "value"],
        [
            ["UNet parameters", f"{m['parameters']['unet']:,}"],
            ["text encoders", f"{m['parameters']['text_encoder']:,} + "
                              f"{m['parameters']['text_encoder_2']:,}"],
            ["VAE parameters", f"{m['parameters']['vae']:,}"],
            [f"UNet FLOPs per pass, batch 1, {m['size']}x{m['size']} (FlopCounterMode, meta)",
             flops_text(m["unet_flops_per_pass"])],
            [f"UNet FLOPs per image ({m['steps']} steps x 2 with guidance)",
             flops_text(m["flops_per_image"])],
            [f"measured matmul peak ({results['device']['dtype']})",
             flops_text(results["device"]["matmul_peak"], per_s=True)],
            ["versions", ", ".join(f"{k} {v}" for k, v in results["device"].items()
                                   if k in VERSION_KEYS and v is not None)],
        ],
    )
    measured = [c for c in results["cells"] if c["skipped"] is None]
    cells = [c for c in measured if c.get("speed", "quality") == "quality"]
    turbo_cells = [c for c in measured if c.get("speed") == "turbo"]
    if cells or not turbo_cells:  # a turbo-only run has no quality cells to show
        table(
            f"Throughput: {m['size']}x{m['size']}, {m['steps']} steps, guidance {m['guidance']}; "
            "direct = PipelineWorker.run in process, service = HTTP (2 async clients, n=batch)",
            ["config", "batch", "direct images/s", "service images/s", "service/direct",
             "MFU (service)", "peak GiB", "failed", "recompiles", "new graphs", "service ready s"],
            [[c["config"], c["batch"], c["direct"], c["service"], f"{c['ratio']:.3f}",
              f"{c['mfu_service']:.1%}", gib_text(c["peak_memory_gib"]), c["failed_images"],
              int(c["service_recompiles"]), c["graphs_compiled_while_measuring"],
              f"{c.get('service_ready_s', float('nan')):.1f}"] for c in cells],
        )
    base = {c["batch"]: c["service"] for c in cells if c["config"] == "baseline"}
    rows = [[c["config"], c["batch"], f"{c['service'] / base[c['batch']]:.2f}"]
            for c in cells if c["config"] != "baseline" and c["batch"] in base]
    if rows:
        table("Speed-up over the baseline at the same batch (service images/s, one run)",
              ["config", "batch", "x baseline"], rows)
    warm_rows = []
    for run in results["configs"]:
        for shape, seconds in run["warmup_s"].items():
            warm = run["warmup_warm_cache_s"].get(shape)
            warm_rows.append([run["config"], shape, seconds,
                              "" if warm is None else warm, run["compiled_graphs"],
                              run["graph_breaks"]])
    if warm_rows:
        table("Warm-up: first batch of each shape (2 steps, compilation included), seconds",
              ["config", "shape", "cold cache", "warm cache (new process)", "graphs",
               "graph breaks"], warm_rows)
    drift_rows = [[r["config"], d["images"], f"{d['psnr_db_mean']:.1f}",
                   f"{d['psnr_db_min']:.1f}", f"{d['visibly_changed']} / {d['images']}",
                   d["max_levels"]]
                  for r in results["configs"] if (d := r.get("drift")) is not None]
    if drift_rows:
        table(f"Image drift against the baseline, same seeds (PSNR of the uint8 images; "
              f"visibly changed: > {VISIBLE_SHARE:.0%} of the pixels differ by > "
              f"{VISIBLE_LEVELS}/255)",
              ["config", "images", "PSNR dB (mean)", "PSNR dB (lowest)", "visibly changed",
               "largest difference /255"], drift_rows)
    if turbo_cells:
        sampling = turbo_cells[0]["turbo"] or {}
        drawn = (f"{sampling.get('scheduler')}, {sampling.get('steps')} steps, guidance "
                 f"{sampling.get('guidance')}" if sampling else "as the service draws turbo")
        table(f"Speed turbo: {m['size']}x{m['size']}, {drawn} (a turbo LoRA fused into a "
              "second UNet); through HTTP only (2 async clients, n=batch)",
              ["config", "batch", "service images/s", "MFU (service)", "peak GiB", "failed",
               "recompiles", "new graphs", "service ready s"],
              [[c["config"], c["batch"], c["service"], f"{c['mfu_service']:.1%}",
                gib_text(c["peak_memory_gib"]), c["failed_images"],
                int(c["service_recompiles"]), c["graphs_compiled_while_measuring"],
                f"{c['service_ready_s']:.1f}"] for c in turbo_cells])
    skipped = [f"{c['config']} @ {c['batch']}: {c['skipped']}"
               for c in results["cells"] if c["skipped"]]
    skipped += [f"{r['config']}: {r['skipped']}" for r in results["configs"] if r["skipped"]]
    if skipped:
        print("\nnot measured:\n  " + "\n  ".join(skipped))
    if cells and not results["tiny"]:
        best = max(cells, key=lambda c: c["service"])
        worst_ratio = min(c["ratio"] for c in cells)
        print(f"\ngoal >= {GOAL_IMAGES_S} images/s through HTTP: best {best['service']:.3f} "
              f"({best['config']} @ {best['batch']}, MFU {best['mfu_service']:.1%}): "
              f"{'met' if best['service'] >= GOAL_IMAGES_S else 'MISSED'}")
        print(f"goal service/direct >= {GOAL_RATIO}: lowest {worst_ratio:.3f}: "
              f"{'met' if worst_ratio >= GOAL_RATIO else 'MISSED'}")
        new = [c for c in cells if c["config"].startswith("new-best")]
        if new:
            top = max(new, key=lambda c: c["service"])
            print(f"goal >= {GOAL_HOPPER_IMAGES_S} images/s with FP8, CUDA graphs and the "
                  f"fastest attention: {top['service']:.3f} (batch {top['batch']}): "
                  f"{'met' if top['service'] >= GOAL_HOPPER_IMAGES_S else 'MISSED'}")
    if turbo_cells and not results["tiny"]:
        top = max(turbo_cells, key=lambda c: c["service"])
        print(f"goal >= {GOAL_TURBO_IMAGES_S} images/s per H100 with speed turbo (4 steps, no "
              f"guidance): {top['service']:.3f} ({top['config']} @ {top['batch']}, MFU "
              f"{top['mfu_service']:.1%}): "
              f"{'met' if top['service'] >= GOAL_TURBO_IMAGES_S else 'MISSED'}")


# -- main -----------------------------------------------------------------------------------
