"""FP8 diagnosis (issue 40): the first quantized layer of SDXL's UNet whose output goes NaN/Inf,
under each suspect, on one GPU in under 3 minutes.

``GENAUG_QUANTIZE=fp8`` drew every image NaN on an H100 (torch 2.11+cu130, torchao 0.18). This
builds the full-size SDXL base 1.0 UNet with random weights (``bench/gpu/sdxl/unet.json``, as
:mod:`bench.gpu._sdxl_model` builds it), quantizes copies of it with the product's own path
(:func:`genaug.service.pipeline.quantize.quantize_fp8`: its layer choice, its torchao
configuration), hooks every module and runs one UNet forward per variant at 128x128 latents
(1024x1024 images), the first denoising step of one image with guidance: the conditional row
with text states drawn at random, the unconditional row with zeros, as SDXL's pipeline makes
them (``force_zeros_for_empty_prompt``). Per variant: finite or not, the first module whose
output is not (its name, whether it is quantized, its input's largest value and rows of
zeros, whether the same product with the weight dequantized is finite), and the output's
relative error against bf16.

Variants (one process each for what must be set before torchao is imported):

- ``product``: today's configuration (per-row scales, ``activation_value_lb``: a row of zeros
  quantizes to zeros); ``no-lb``: the same without the bound (the configuration that made NaN
  on the CPU: 0/0 on rows of zeros); ``no-lb@random-uncond``: random unconditional text
  states (no rows of zeros); ``per-tensor``; ``no-fast-accum``; ``kernel=torch`` (differs from
  ``auto`` where ``mslk`` is installed); ``weight-only`` (no FP8 product: the weight
  dequantized); ``product@32`` (32x32 latents: the activations' size);
- ``no-lb+skip``: the bound left out again, the first non-finite layer's family (e.g.
  ``attn2.to_out``) kept in bf16 (``quantize_fp8(skip=...)``), repeated until finite (at most 4):
  which layers a skip list would need;
- processes: ``default``; ``skip-so`` (``TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1``: torchao's
  compiled libraries not loaded); ``torchao-0.17`` (torchao's release for torch 2.11, from
  ``.whl/torchao-0.17/``, which ``python -m bench.gpu.gpu_wheels`` fetches beside 0.18).

Usage::

    python -m bench.gpu.fp8_diagnose                       # CUDA, full SDXL UNet, 128x128
    python -m bench.gpu.fp8_diagnose --tiny                # CPU: tiny-digits' UNet, 8x8
    bash bench/gpu/gpu_run.sh --plan fp8                   # the same -> $OUT/fp8_diagnose.json

On the CPU (``--tiny``, or ``--device cpu``) genaug's and torchao's hardware checks are set
aside (torch 2.13's ``torch._scaled_mm`` runs on the CPU): the same code, known to work before
it first runs on a GPU. ``--json`` (default ``$OUT/fp8_diagnose.json`` when ``$OUT`` is set)
is rewritten after each process, so a run cut short keeps what it found.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.harness import ROOT, main, table

WHEEL_017 = ROOT / ".whl" / "torchao-0.17"
#: The processes, in order: name -> environment added.
PROCESSES: dict[str, dict[str, str]] = {
    "default": {},
    "skip-so": {"TORCHAO_FORCE_SKIP_LOADING_SO_FILES": "1"},
    "torchao-0.17": {},
}
#: In-process variants, in order (the ``default`` process runs them all).
VARIANTS = ("product", "no-lb", "no-lb@random-uncond", "per-tensor", "no-fast-accum",
            "kernel=torch", "weight-only", "product@32", "no-lb+skip")
#: What the other processes run: is the suspect alone enough to make or unmake the NaN?
SHORT_VARIANTS = ("product", "no-lb", "per-tensor")
SKIP_ROUNDS = 4
TEXT_TOKENS = 77


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.gpu.fp8_diagnose",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--tiny", action="store_true",
                   help="tiny-digits' UNet on the CPU, hardware checks set aside (tests)")
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--latent", type=int, default=None, help="latent side (128; tiny 8)")
    p.add_argument("--images", type=int, default=1,
                   help="images per forward (the UNet sees twice as many rows: guidance)")
    p.add_argument("--processes", default=",".join(PROCESSES),
                   help=f"comma-separated, of {', '.join(PROCESSES)}")
    p.add_argument("--variants", default=None,
                   help="comma-separated variants for every process (default: all in "
                   "'default', a short list in the others)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no process after this many seconds (default 150 on CUDA)")
    p.add_argument("--json", type=Path, default=None,
                   help="write the results here (default $OUT/fp8_diagnose.json if $OUT)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.json is None and os.environ.get("OUT"):
        args.json = Path(os.environ["OUT"]) / "fp8_diagnose.json"
    return args


# -- the parent: one process per suspect -----------------------------------------------------


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.child:
        return run_child(args)
    started = time.monotonic()
    budget = args.budget_s if args.budget_s is not None else (
        float("inf") if args.tiny or args.device == "cpu" else 150.0)
    result: dict[str, Any] = {"benchmark": "fp8_diagnose", "tiny": args.tiny,
                              "processes": [], "verdict": []}
    for name in [n.strip() for n in args.processes.split(",") if n.strip()]:
        if name not in PROCESSES:
            raise SystemExit(f"--processes: {name!r} is not one of {', '.join(PROCESSES)}")
        elapsed = time.monotonic() - started
        if elapsed > budget:
            entry: dict[str, Any] = {"process": name, "skipped": f"time budget ({elapsed:.0f} s)"}
        else:
            entry = run_process(args, name)
        result["processes"].append(entry)
        result["verdict"] = verdict(result["processes"])
        save(result, args.json)
        print(f"[{name}] " + (entry.get("skipped") or entry.get("error") or
                              f"{len(entry['runs'])} variants in {entry['seconds']:.1f} s"),
              flush=True)
    report(result)
    return result


def save(result: dict[str, Any], path: Path | None) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2, default=str))


def run_process(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """One child process (``--child name``): its environment, its JSON on stdout's last line."""
    env = {**os.environ, **PROCESSES[name]}
    with tempfile.TemporaryDirectory(prefix="fp8-diagnose-") as tmp:
        if name == "torchao-0.17":
            wheels = sorted(WHEEL_017.glob("torchao-*.whl"))
            if not wheels:
                return {"process": name, "skipped": f"no wheel in {WHEEL_017.relative_to(ROOT)}/ "
                        "(python -m bench.gpu.gpu_wheels fetches it)"}
            target = Path(tmp) / "site"
            install = subprocess.run(
                [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                 "--no-compile", "--target", str(target), str(wheels[-1])],
                capture_output=True, text=True,
            )
            if install.returncode != 0:
                return {"process": name, "error": f"pip install: {install.stderr[-500:]}"}
            # First on the path: it shadows the torchao 0.18 that gpu_run.sh installed.
            env["PYTHONPATH"] = os.pathsep.join(
                [str(target), *filter(None, [env.get("PYTHONPATH")])])
        out = Path(tmp) / "child.json"
        cmd = [sys.executable, *(["-P"] if sys.flags.safe_path else []), "-m",
               "bench.gpu.fp8_diagnose", "--child", name, "--json", str(out),
               "--images", str(args.images)]
        for flag, value in (("--device", args.device), ("--latent", args.latent),
                            ("--variants", args.variants)):
            if value is not None:
                cmd += [flag, str(value)]
        if args.tiny:
            cmd.append("--tiny")
        t0 = time.monotonic()
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            return {"process": name, "error": f"exit {proc.returncode}: "
                    + (proc.stderr or proc.stdout)[-2000:]}
        entry: dict[str, Any] = json.loads(out.read_text())
        entry["seconds"] = time.monotonic() - t0
        return entry


def verdict(processes: Sequence[dict[str, Any]]) -> list[str]:
    """One line per finding: which variants are finite, and where the others went NaN."""
    lines = []
    for entry in processes:
        if "runs" not in entry:
            continue
        finite = [r["variant"] for r in entry["runs"] if r.get("finite")]
        bad = [r for r in entry["runs"] if r.get("finite") is False]
        text = f"{entry['process']} (torchao {entry['env'].get('torchao')}): finite: " + (
            ", ".join(finite) or "none")
        for r in bad:
            first = r.get("first_nonfinite") or {}
            text += (f"; {r['variant']} NaN/Inf first at {first.get('name')} "
                     f"(quantized {first.get('quantized')}, input zero rows "
                     f"{first.get('input_zero_rows')}, dequantized-weight product finite "
                     f"{first.get('dequantized_finite')})")
            if r.get("skip"):
                text += f", finite with skip={r['skip']}: {r.get('skip_finite')}"
        lines.append(text)
    return lines


def report(result: dict[str, Any]) -> None:
    rows = []
    for entry in result["processes"]:
        for r in entry.get("runs", []):
            first = r.get("first_nonfinite") or {}
            rows.append([entry["process"], r["variant"], r.get("quantized_layers", ""),
                         "yes" if r.get("finite") else ("no" if r.get("finite") is False
                                                        else r.get("error", "?")[:60]),
                         "" if r.get("rel_error") is None else f"{r['rel_error']:.2%}",
                         first.get("name", "")])
        if "runs" not in entry:  # the reason, or the error's last line
            reason = entry.get("skipped") or str(entry.get("error", "")).strip().splitlines()[-1]
            rows.append([entry["process"], "-", "", reason[:120], "", ""])
    table("FP8 diagnosis: one UNet forward per variant",
          ["process", "variant", "layers", "finite", "error vs bf16", "first NaN/Inf"], rows)
    for line in result["verdict"]:
        print("-", line)


# -- the child: one UNet, every variant --------------------------------------------------------


def run_child(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from genaug.service.pipeline.quiet import held_back, quiet_third_party

    quiet_third_party()  # torchao's import lines held back: recorded below, not printed
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.tiny
                                          else "cpu"))
    latent = args.latent or (8 if args.tiny else 128)
    torch.manual_seed(0)
    unet, min_features = build_unet(args.tiny, device)
    import torchao

    from genaug.service.pipeline.errors import AccelerationError
    from genaug.service.pipeline.quantize import check_fp8

    entry: dict[str, Any] = {"process": args.child, "device": str(device), "latent": latent,
                             "images": args.images, "env": environment(device, torchao)}
    try:
        check_fp8(device)
        entry["fp8_check"] = "passed"
    except AccelerationError as exc:  # the CPU: set aside below, recorded here
        entry["fp8_check"] = f"set aside: {exc}"
    entry["env"]["torchao_import_log"] = held_back("torchao")
    default_variants = VARIANTS if args.child == "default" else SHORT_VARIANTS
    names = [v.strip() for v in (args.variants or ",".join(default_variants)).split(",")
             if v.strip()]
    inputs = {size: make_inputs(unet, args.images, size, device) for size in {latent, 32}
              if size == latent or any(n.endswith("@32") for n in names)}
    runs: list[dict[str, Any]] = []
    with hardware_check_set_aside(device):
        reference = {key: forward(unet, value) for key, value in inputs.items()}
        entry["bf16_finite"] = all(bool(torch.isfinite(out).all()) for out in reference.values())
        for name in names:
            t0 = time.monotonic()
            try:
                runs.append(run_variant(name, unet, inputs, reference, latent, min_features))
            except Exception as exc:  # an API another torchao lacks: reported, not fatal
                runs.append({"variant": name, "error": f"{type(exc).__name__}: {exc}"})
            runs[-1]["seconds"] = time.monotonic() - t0
            if device.type == "cuda":
                torch.cuda.empty_cache()
    entry["runs"] = runs
    if args.json is not None:
        save(entry, args.json)
    return entry


def build_unet(tiny: bool, device: Any) -> tuple[Any, int]:
    """The UNet in bf16 and the ``min_features`` its layers are chosen at: SDXL's at the
    product's default; tiny-digits' at 32 (its layers are 16 to 256 wide: 40 of them)."""
    import torch

    if tiny:
        from genaug.service.pipeline.tiny import build_tiny_digits_pipeline

        # Not batch-invariant: that wrapper holds the original module, so a copy would run it.
        pipeline, _ = build_tiny_digits_pipeline(batch_invariant=False)
        return pipeline.unet.to(device=device, dtype=torch.bfloat16).eval(), 32
    from diffusers import UNet2DConditionModel

    from bench.gpu._sdxl_model import load_config
    from genaug.service.pipeline.quantize import FP8_MIN_FEATURES

    with torch.device(device):
        unet = UNet2DConditionModel.from_config(load_config("unet"))
    return unet.to(dtype=torch.bfloat16).eval(), FP8_MIN_FEATURES


def environment(device: Any, torchao: Any) -> dict[str, Any]:
    import importlib.util

    import torch

    out: dict[str, Any] = {
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "torchao": getattr(torchao, "__version__", "?"), "torchao_path": torchao.__file__,
        "mslk": importlib.util.find_spec("mslk") is not None,
        "skip_so_files": os.environ.get("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", ""),
    }
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
        out["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
    return out


@contextmanager
def hardware_check_set_aside(device: Any) -> Iterator[None]:
    """On the CPU, torchao's assertion that the GPU has FP8 set aside (torch's ``_scaled_mm``
    runs on the CPU); on CUDA nothing changes."""
    if device.type == "cuda":
        yield
        return
    from torchao.quantization import quant_api

    saved = quant_api._check_hardware_support
    quant_api._check_hardware_support = lambda granularities: None
    try:
        yield
    finally:
        quant_api._check_hardware_support = saved


def make_inputs(unet: Any, images: int, latent: int, device: Any) -> dict[str, dict[str, Any]]:
    """The first step's UNet inputs for ``images`` images with guidance: ``pipeline`` (the
    unconditional rows' text states and pooled embeddings zeros, as SDXL's pipeline makes them
    for no negative prompt) and ``random-uncond`` (drawn at random: no rows of zeros)."""
    import torch

    config = unet.config
    dtype = torch.bfloat16
    generator = torch.Generator(device="cpu").manual_seed(1234)

    def draw(*shape: int) -> Any:
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    pooled = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim
    side = latent * 8
    time_ids = torch.tensor([[side, side, 0, 0, side, side]] * 2 * images, device=device,
                            dtype=dtype)
    sample = draw(2 * images, config.in_channels, latent, latent)
    cond_text, cond_pooled = draw(images, TEXT_TOKENS, config.cross_attention_dim), draw(
        images, pooled)
    out = {}
    for kind, uncond_text, uncond_pooled in (
        ("pipeline", torch.zeros_like(cond_text), torch.zeros_like(cond_pooled)),
        ("random-uncond", draw(images, TEXT_TOKENS, config.cross_attention_dim),
         draw(images, pooled)),
    ):
        out[kind] = {
            "sample": sample,
            "timestep": torch.tensor(999, device=device),
            "encoder_hidden_states": torch.cat([uncond_text, cond_text]),
            "added_cond_kwargs": {"text_embeds": torch.cat([uncond_pooled, cond_pooled]),
                                  "time_ids": time_ids},
        }
    return out


def forward(unet: Any, inputs: dict[str, dict[str, Any]], kind: str = "pipeline") -> Any:
    import torch

    x = inputs[kind]
    with torch.inference_mode():  # the sample positionally: tiny-digits' per-row wrapper
        return unet(x["sample"], x["timestep"], encoder_hidden_states=x["encoder_hidden_states"],
                    added_cond_kwargs=x["added_cond_kwargs"], return_dict=False)[0].float()


def config_for(variant: str) -> Any:
    """The torchao configuration of ``variant`` (``None``: the product's own)."""
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig as Dynamic
    from torchao.quantization import PerRow, PerTensor

    from genaug.service.pipeline.quantize import FP8_ACTIVATION_LB

    base = variant.split("@")[0].split("+")[0]
    if base == "product":
        return None
    if base == "no-lb":
        return Dynamic(granularity=PerRow())
    if base == "per-tensor":
        return Dynamic(granularity=PerTensor())
    if base == "no-fast-accum":
        from torchao.float8.inference import Float8MMConfig

        return Dynamic(granularity=PerRow(), activation_value_lb=FP8_ACTIVATION_LB,
                       mm_config=Float8MMConfig(use_fast_accum=False))
    if base == "kernel=torch":
        from torchao.quantization.quantize_.common import KernelPreference

        return Dynamic(granularity=PerRow(), activation_value_lb=FP8_ACTIVATION_LB,
                       kernel_preference=KernelPreference.TORCH)
    if base == "weight-only":
        from torchao.quantization import Float8WeightOnlyConfig

        return Float8WeightOnlyConfig()
    raise ValueError(f"unknown variant {variant!r}; one of {', '.join(VARIANTS)}")


def run_variant(
    variant: str,
    unet: Any,
    inputs: dict[int, dict[str, dict[str, Any]]],
    reference: dict[int, Any],
    latent: int,
    min_features: int,
) -> dict[str, Any]:
    size = 32 if variant.endswith("@32") else latent
    kind = "random-uncond" if variant.endswith("@random-uncond") else "pipeline"
    config = config_for(variant)
    result = quantized_forward(unet, inputs[size], kind, config, min_features, ())
    out: dict[str, Any] = {"variant": variant, "latent": size, "inputs": kind}
    out.update(compare(result, reference[size] if kind == "pipeline" else
                       forward(unet, inputs[size], kind)))
    if variant.endswith("+skip"):
        skip: list[str] = []
        for _ in range(SKIP_ROUNDS):
            first = result["first_nonfinite"]
            if first is None:
                break
            skip.append(layer_family(first["name"]))
            result = quantized_forward(unet, inputs[size], kind, config, min_features, skip)
        out.update(skip=skip, skip_finite=result["finite"],
                   skip_quantized_layers=result["quantized_layers"])
    return out


def compare(result: dict[str, Any], reference: Any) -> dict[str, Any]:
    output = result.pop("output")
    if result["finite"]:
        result["rel_error"] = float((output - reference).norm() / reference.norm())
    return result


def quantized_forward(
    unet: Any,
    inputs: dict[str, dict[str, Any]],
    kind: str,
    config: Any,
    min_features: int,
    skip: Sequence[str],
) -> dict[str, Any]:
    """A copy of ``unet`` quantized by the product's path, one forward with every module
    hooked: whether its output is finite and the first module whose output is not."""
    import torch

    from genaug.service.pipeline.quantize import quantize_fp8

    model = copy.deepcopy(unet)
    names = quantize_fp8(model, min_features=min_features, skip=skip, config=config)
    quantized = set(names)
    first: list[dict[str, Any]] = []
    handles = [module.register_forward_hook(watch(name, module, quantized, first))
               for name, module in model.named_modules() if name]
    try:
        output = forward(model, inputs, kind)
    finally:
        for handle in handles:
            handle.remove()
    finite = bool(torch.isfinite(output).all())
    del model
    return {"quantized_layers": len(names), "finite": finite, "output": output,
            "first_nonfinite": first[0] if first else None}


def watch(
    name: str, module: Any, quantized: set[str], first: list[dict[str, Any]]
) -> Callable[..., None]:
    """A forward hook: the first module (in the order they finish) whose output is not finite,
    with what its input was."""
    import torch

    def hook(_module: Any, args: Any, output: Any) -> None:
        if first:
            return
        tensor = output[0] if isinstance(output, tuple) else output
        tensor = getattr(tensor, "sample", tensor)
        if not isinstance(tensor, torch.Tensor) or bool(torch.isfinite(tensor).all()):
            return
        info: dict[str, Any] = {"name": name, "type": type(module).__name__,
                                "quantized": name in quantized}
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if x is not None:
            flat = x.detach().float().reshape(-1, x.shape[-1])
            info.update(input_finite=bool(torch.isfinite(flat).all()),
                        input_amax=float(flat.abs().max()),
                        input_rows=flat.shape[0],
                        input_zero_rows=int((flat.abs().amax(dim=-1) == 0).sum()),
                        output_nonfinite_share=float((~torch.isfinite(tensor)).float().mean()))
            weight = getattr(module, "weight", None)
            if name in quantized and hasattr(weight, "dequantize"):
                # The same product with the weight dequantized and the input unquantized: finite
                # here and not in the layer means the activation's quantization or the FP8 kernel.
                plain = torch.nn.functional.linear(x, weight.dequantize(), module.bias)
                info["dequantized_finite"] = bool(torch.isfinite(plain).all())
        first.append(info)

    return hook


def layer_family(name: str) -> str:
    """The part of a layer's name that repeats in every block (what a skip list names):
    ``down_blocks.2.attentions.0.transformer_blocks.3.attn2.to_out.0`` -> ``attn2.to_out``."""
    parts = name.split(".")
    while parts and parts[-1].isdigit():
        parts.pop()
    for i in range(len(parts) - 1, 0, -1):
        if parts[i].isdigit() and parts[i - 1] in ("transformer_blocks", "attentions",
                                                   "resnets", "down_blocks", "up_blocks"):
            return ".".join(parts[i + 1:]) or name
    return ".".join(parts) or name


if __name__ == "__main__":
    main(run)
