"""bench.gpu.gpu_sdxl stays ready for a GPU: its SDXL configs build the published model, its
FLOP count is the model's (both in :mod:`bench.gpu._sdxl_model`, which the GPU scripts share),
and ``--tiny`` runs the whole measurement on the CPU."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from bench.gpu import _sdxl_bench as measuring
from bench.gpu import _sdxl_model as sdxl

ROOT = Path(__file__).resolve().parents[2]
MODULE = "bench.gpu.gpu_sdxl"  # run from the repository root, as the benchmarks are

# stabilityai/stable-diffusion-xl-base-1.0, as published.
SDXL_PARAMETERS = {
    "unet": 2_567_463_684,
    "text_encoder": 123_060_480,  # CLIP ViT-L/14 text tower
    "text_encoder_2": 694_659_840,  # OpenCLIP ViT-bigG/14 text tower with projection
    "vae": 83_653_863,
}
# FlopCounterMode over one UNet forward at batch 1, 1024x1024 (128x128 latents), meta device.
SDXL_UNET_FLOPS_1024 = 6_761_236_398_080


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return importlib.import_module(MODULE)


def test_configs_build_sdxl_base_at_full_size_on_meta() -> None:
    import torch

    assert sdxl.parameter_counts_sdxl() == SDXL_PARAMETERS
    # The GPU path itself (construction on the device, cast, pipeline assembly), on meta.
    model = sdxl.build_sdxl(torch.device("meta"), torch.bfloat16)
    assert sdxl.parameter_counts(model.pipeline) == SDXL_PARAMETERS
    pipe = model.pipeline
    assert pipe.unet.dtype == torch.bfloat16 and pipe.unet.device.type == "meta"
    assert pipe.unet.config.cross_attention_dim == 768 + 1280
    assert type(pipe.scheduler).__name__ == "EulerDiscreteScheduler"
    assert pipe.vae.config.scaling_factor == 0.13025


def test_unet_flops_are_counted_from_the_model() -> None:
    flops = sdxl.count_unet_flops(sdxl.load_config("unet"), 1024, 1024)
    assert flops == SDXL_UNET_FLOPS_1024  # ~6.76 TFLOP per pass
    # Convolutions and projections scale with the latent pixels, self-attention with their
    # square: a quarter of the pixels costs a little less than a quarter of the FLOPs.
    quarter = sdxl.count_unet_flops(sdxl.load_config("unet"), 512, 512)
    assert SDXL_UNET_FLOPS_1024 / 5 < quarter < SDXL_UNET_FLOPS_1024 / 4


def test_plans_put_baseline_and_best_at_batch_1_and_8_first(bench: Any) -> None:
    args = bench.parse_args([])
    assert (args.size, args.steps, args.rounds, args.plan) == (1024, 30, 2, "first")
    assert bench.plan_cells(args) == [("baseline", [1, 8]), ("best", [1, 8])]
    assert bench.plan_cells(bench.parse_args(["--plan", "sizes"])) == [
        ("baseline", [4, 16]), ("best", [4, 16])
    ]
    options = bench.plan_cells(bench.parse_args(["--plan", "options"]))
    assert options[0] == ("baseline", [8]) and len(options) == 1 + len(bench.SINGLES)
    custom = bench.parse_args(["--configs", "baseline,compile=unet+fuse_qkv", "--batches", "2"])
    assert bench.plan_cells(custom) == [("baseline", [2]), ("compile=unet+fuse_qkv", [2])]
    assert bench.options_of("best", bench.BEST).label == "compile=regional+fuse_qkv"


def test_the_hopper_plan_adds_each_new_option_to_todays_best_then_all(bench: Any) -> None:
    cells = bench.plan_cells(bench.parse_args(["--plan", "hopper"]))
    assert cells[0] == ("baseline", [8])  # the drift reference
    assert cells[1] == ("best", [1, 8, 16]) and cells[-1] == ("new-best", [1, 8, 16])
    added = [bench.options_of(c, bench.BEST) for c, _ in cells[2:-1]]
    assert [o.label for o in added] == [
        "compile=regional+attention=auto+fuse_qkv",
        "compile=regional+quantize=fp8+fuse_qkv",
        "compile=regional+quantize=fp8-conv+fuse_qkv",
        "compile=unet+compile_mode=reduce-overhead+fuse_qkv",
        "compile=unet+compile_mode=max-autotune+fuse_qkv",
    ]
    new = bench.options_of("new-best", bench.BEST)
    assert (new.compile, new.compile_mode, new.quantize, new.attention, new.fuse_qkv) == (
        "unet", "max-autotune", "fp8", "auto", True
    )
    assert new.cuda_graphs
    # The baseline keeps torch's own attention order: what earlier runs measured.
    assert bench.options_of("baseline", bench.BEST).attention == "default"


def test_drift_metrics_psnr_and_visible_change() -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    assert sdxl.psnr_db(a, a) == float("inf")
    b = a.astype(np.int16)
    b[..., 0] += np.where(b[..., 0] < 128, 1, -1)  # every pixel off by 1 level in one channel
    b = b.astype(np.uint8)
    # MSE = 1/3 (one channel of three): 10 log10(255^2 * 3) = 52.9 dB.
    assert sdxl.psnr_db(a, b) == pytest.approx(10 * np.log10(255**2 * 3), abs=1e-9)
    assert sdxl.visible_share(a, b) == 0.0 and not sdxl.visibly_changed(a, b)
    c = a.copy()
    c[:1, :40] = np.where(a[:1, :40] < 128, 255, 0)  # 40 pixels set far off
    share = sdxl.visible_share(a, c)
    assert share == pytest.approx(40 / 4096)  # 0.98 %: at the threshold, not over it
    assert not sdxl.visibly_changed(a, c)
    c[1:2, :10] = np.where(a[1:2, :10] < 128, 255, 0)  # 50 pixels: 1.2 %
    assert sdxl.visibly_changed(a, c)
    nine = a.astype(np.int16)
    nine[:8, :8, 2] = np.where(nine[:8, :8, 2] < 128, nine[:8, :8, 2] + 8, nine[:8, :8, 2] - 8)
    assert sdxl.visible_share(a, nine.astype(np.uint8)) == 0.0  # 8 levels: not over 8
    report = sdxl.drift([a, a], [b, c])
    assert report["images"] == 2 and report["visibly_changed"] == 1
    assert report["visibly_changed_share"] == 0.5 and report["max_levels"] >= 128
    assert report["psnr_db_min"] == sdxl.psnr_db(a, c) < report["psnr_db_mean"]
    with pytest.raises(ValueError):
        sdxl.drift([a], [a, a])


def run_tiny(tmp_path: Path, *extra: str, timeout: float) -> tuple[dict[str, Any], str]:
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-m", MODULE, "--tiny", "--quick", "--steps", "2", "--json", str(out),
         "--cache-dir", str(tmp_path / "inductor"), *extra],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


@pytest.mark.slow  # the GPU benchmark end to end in --tiny mode: 10-16 s on 2 cores
def test_tiny_mode_measures_direct_and_service_side_by_side(tmp_path: Path) -> None:
    result, stdout = run_tiny(
        tmp_path, "--configs", "baseline,fuse_qkv,quantize=fp8", "--batches", "2", timeout=240
    )
    model = result["model"]
    assert model["flops_per_image"] == 2 * 2 * model["unet_flops_per_pass"] > 0
    assert result["device"]["matmul_peak"] > 0
    assert result["device"]["torch"] and result["device"]["python"]
    assert "torchao" in result["device"] and "cudnn" in result["device"]
    cells = result["cells"]
    assert [(c["config"], c["batch"], c["skipped"]) for c in cells] == [
        ("baseline", 2, None), ("fuse_qkv", 2, None)
    ]
    # FP8 is refused on the CPU, in one line, and the run goes on (reported, not measured).
    fp8 = result["configs"][2]
    assert fp8["config"] == "quantize=fp8"
    assert "GENAUG_QUANTIZE=fp8 needs a CUDA GPU" in fp8["skipped"]
    # Drift against the baseline's images of the same seeds: none for the baseline itself,
    # within the tolerance of numerically equivalent options for fused projections.
    base, fused = result["configs"][0]["drift"], result["configs"][1]["drift"]
    assert base["images"] == 2 and base["psnr_db_mean"] == float("inf")
    assert fused["visibly_changed"] == 0 and fused["max_levels"] <= 2
    for cell in cells:
        assert cell["direct"] > 0 and cell["service"] > 0 and cell["failed_images"] == 0
        assert cell["ratio"] == pytest.approx(cell["service"] / cell["direct"], rel=1e-9)
        flops = model["flops_per_image"] / result["device"]["matmul_peak"]
        assert cell["mfu_service"] == pytest.approx(cell["service"] * flops, rel=1e-9)
    assert [r["options"]["fuse_qkv"] for r in result["configs"]] == [False, True, False]
    for title in ("Model and device", "Throughput", "Speed-up over the baseline", "Warm-up",
                  "Image drift against the baseline"):
        assert title in stdout


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_tiny_mode_compiles_the_best_combination_and_checks_the_warm_cache(
    tmp_path: Path,
) -> None:
    result, stdout = run_tiny(tmp_path, "--configs", "best", "--batches", "1", timeout=1500)
    (run,) = result["configs"]
    assert run["options"]["compile"] == "regional" and run["compiled_graphs"] >= 1
    cold, warm = run["warmup_s"]["64x64:1"], run["warmup_warm_cache_s"]["64x64:1"]
    assert warm < cold  # the new process found the compiled code in the cache
    assert result["cells"][0]["service_recompiles"] == 0
    assert result["cells"][0]["graphs_compiled_while_measuring"] == 0


def test_the_speed_plan_is_baseline_best_and_new_best_at_8_and_16_and_turbo_at_16(
    bench: Any,
) -> None:
    cells = bench.plan_cells(bench.parse_args(["--plan", "speed"]))
    assert cells == [("baseline", [8, 16]), ("best", [8, 16]), ("turbo", [16]),
                     ("new-best", [8, 16])]
    for config, _ in cells:  # each is a combination the service accepts
        bench.options_of(config, bench.BEST)
    # turbo: today's best options, unless it names its own.
    assert bench.options_of("turbo", bench.BEST).label == "compile=regional+fuse_qkv"
    assert bench.options_of("turbo+fuse_qkv", bench.BEST).label == "fuse_qkv"
    assert importlib.import_module("bench.gpu._sdxl_report").GOAL_TURBO_IMAGES_S == 10.0


def test_the_turbo_cell_serves_a_turbo_lora_and_asks_for_speed_turbo(
    bench: Any, tmp_path: Path,
) -> None:
    """Its service has GENAUG_TURBO_LORA / GENAUG_TURBO_KIND; its requests say speed turbo
    and leave steps and guidance to the service (its turbo steps, scheduler, guidance)."""
    args = bench.parse_args(["--plan", "speed"])
    assert args.turbo_kind == "lcm"
    run = measuring.Bench(args, None, None, 0.0, {})
    options = bench.options_of("turbo", bench.BEST)
    lora = tmp_path / "turbo-lcm.safetensors"
    settings = measuring.service_settings(run, options, 16, turbo=(lora, "lcm"))
    assert (settings.turbo_lora, settings.turbo_kind) == (lora, "lcm")
    assert (settings.compile, settings.max_batch_images) == ("regional", 16)
    assert measuring.service_settings(run, options, 16).turbo_lora is None
    turbo = measuring.generate_options(run, 16, 7, "turbo")
    assert turbo == {"n": 16, "seed": 7, "height": 1024, "width": 1024, "timeout_s": 3600,
                     "speed": "turbo"}
    quality = measuring.generate_options(run, 8, 7, "quality")
    assert (quality["steps"], quality["guidance"]) == (30, bench.GUIDANCE)
    assert "speed" not in quality


@pytest.mark.slow  # the turbo cell end to end in --tiny mode: a service with its turbo UNet
def test_tiny_mode_measures_speed_turbo_through_http(tmp_path: Path) -> None:
    result, stdout = run_tiny(tmp_path, "--configs", "turbo+fuse_qkv", "--batches", "2",
                              timeout=240)
    (run,) = result["configs"]
    assert run["skipped"] is None and run["turbo_lora"]["layers"] == 79
    (cell,) = result["cells"]
    assert (cell["speed"], cell["batch"], cell["skipped"]) == ("turbo", 2, None)
    assert cell["service"] > 0 and cell["failed_images"] == 0
    assert cell["direct"] != cell["direct"]  # NaN: through HTTP only
    turbo = cell["turbo"]
    assert (turbo["kind"], turbo["scheduler"], turbo["steps"]) == ("lcm", "lcm", 4)
    flops = result["model"]["unet_flops_per_pass"] * 4 / result["device"]["matmul_peak"]
    assert cell["mfu_service"] == pytest.approx(cell["service"] * flops, rel=1e-9)
    assert "Speed turbo: 64x64, lcm, 4 steps" in stdout and "Throughput" not in stdout
    assert not Path(result["work_dir"], "turbo-lcm.safetensors").exists()  # removed after


def test_the_turbo_lora_writer_runs_as_a_module(tmp_path: Path) -> None:
    """``python -m bench.gpu.turbo_lora_file``, as the turbo cell runs it (a child process),
    here for the tiny UNet's config: the lcm layout's kohya keys with alphas."""
    from safetensors import safe_open

    from genaug.service.testing import load_tiny

    config = tmp_path / "unet.json"
    config.write_text(json.dumps(dict(load_tiny(threads=None).pipeline.unet.config)))
    out, report = tmp_path / "lcm.safetensors", tmp_path / "lcm.json"
    subprocess.run([sys.executable, "-m", "bench.gpu.turbo_lora_file", "--kind", "lcm",
                    "--out", str(out), "--config", str(config), "--rank", "4", "--json",
                    str(report)], cwd=ROOT, check=True, capture_output=True, timeout=120)
    written = json.loads(report.read_text())
    with safe_open(str(out), framework="pt") as handle:
        keys = list(handle.keys())
    assert written["layers"] == len(keys) // 3 == 79 and written["bytes"] == out.stat().st_size
    assert all(k.startswith("lora_unet_") for k in keys)


def test_gpu_run_carries_the_whole_package_and_dispatches_the_acceptance_plan(
    tmp_path: Path,
) -> None:
    """gpu_run.sh with stand-ins for python3 and nvidia-smi (they record their arguments).
    With wheels (an offline GPU box): the site it builds holds all of genaug/ (commands/,
    experiments/), and `--plan acceptance` runs bench.gpu.acceptance with its JSON in $OUT;
    other plans go to gpu_sdxl. Without wheels it runs in the installed environment."""
    import os

    stubs = tmp_path / "bin"
    stubs.mkdir()
    calls = tmp_path / "calls.txt"
    for name in ("python3", "nvidia-smi"):
        stub = stubs / name
        stub.write_text(f'#!/bin/sh\necho "{name} $*" >> "{calls}"\ncat > /dev/null\nexit 0\n')
        stub.chmod(0o755)
    site, out, wheels = tmp_path / "site", tmp_path / "out", tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "stand_in-1.0-py3-none-any.whl").write_bytes(b"")
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "OUT": str(out),
           "GENAUG_SITE": str(site), "GENAUG_WHEELS": str(wheels)}
    for plan in ("acceptance", "speed"):
        calls.write_text("")
        done = subprocess.run(["bash", "bench/gpu/gpu_run.sh", "--plan", plan], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr
        text = calls.read_text()
        assert "-m pip install" in text and str(wheels) in text, text
        last = text.strip().splitlines()[-1]
        if plan == "acceptance":
            assert f"-m bench.gpu.acceptance --json {out}/acceptance.json" in last, last
        else:
            assert "-m bench.gpu.gpu_sdxl" in last and last.endswith("--plan speed")
    for part in ("cli.py", "jobs.py", "experiments/fewshot.py", "py.typed"):
        assert (site / "genaug" / part).is_file(), part
    assert not list((site / "genaug").rglob("__pycache__"))
    for part in ("service", "client", "trainer"):
        assert (site / "genaug" / part).resolve() == ROOT / part
    # No wheels: nothing is installed, the benchmark runs where genaug already is.
    calls.write_text("")
    empty = tmp_path / "none"
    empty.mkdir()
    done = subprocess.run(["bash", "bench/gpu/gpu_run.sh"], cwd=ROOT,
                          env={**env, "GENAUG_WHEELS": str(empty)}, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    text = calls.read_text()
    assert "pip install" not in text and "-m bench.gpu.gpu_sdxl --json" in text, text


@pytest.mark.slow  # every check of the GPU acceptance plan on the tiny model: 1-3 min on 2 cores
@pytest.mark.timeout(1200)
def test_the_acceptance_plan_passes_on_the_tiny_model(tmp_path: Path) -> None:
    out = tmp_path / "acceptance.json"
    done = subprocess.run([sys.executable, "-m", "bench.gpu.acceptance", "--tiny", "--json",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=1100)
    report = json.loads(out.read_text())
    failed = {c["name"]: c["error"] for c in report["checks"] if not c["ok"]}
    assert done.returncode == 0 and failed == {}, (failed, done.stdout[-3000:])
    checks = {c["name"]: c for c in report["checks"]}
    assert list(checks) == ["http", "nan_guard", "judge", "adapt", "adapters", "fp8_cuda_graphs"]
    assert checks["adapters"]["found"]["recompiles"] == 0
    assert checks["adapters"]["found"]["graphs_after_warmup"] == 0
    assert checks["fp8_cuda_graphs"]["found"]["marked_steps"] == 8


def test_gpu_wheels_fetches_what_the_boxs_pip_freeze_lacks(tmp_path: Path) -> None:
    """An offline GPU box's `pip freeze` decides what is fetched for it: what it lists stays
    behind, what genaug needs and it lacks is carried, torch never."""
    from bench.gpu.gpu_wheels import read_present, to_carry

    freeze = tmp_path / "box.txt"
    freeze.write_text("# a comment\nFastAPI==0.100.0\ntorch @ file:///wheels/torch.whl\n"
                      "typing_extensions==4.0\n-e git+https://example/x#egg=x\n")
    present = read_present(freeze)
    assert {"fastapi", "torch", "typing-extensions"} <= present
    carried = to_carry(present)
    assert "fastapi" not in carried and "torch" not in carried
    assert {"diffusers", "uvicorn", "pydantic"} <= set(carried)
    assert "typing-extensions" in carried  # FORCE: pydantic needs a recent one
    everything = to_carry(frozenset())
    assert "fastapi" in everything and "torch" not in everything
