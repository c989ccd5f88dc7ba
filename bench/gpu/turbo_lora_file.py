"""A synthetic turbo LoRA file in a kind's published layout (LCM-LoRA, SDXL-Lightning, Hyper-SD,
TCD), its shapes from a UNet config: test data for the turbo UNet and the GPU benchmark.

The published distillations cannot be downloaded here (and are not needed: the benchmark runs
random weights anyway). :func:`write_turbo_lora` writes what such a file is, key for key: the
key names, ``.alpha`` entries, dtype and module coverage of the kind's published file
(:data:`~genaug.service.pipeline.turbo_lora.PUBLISHED_LAYOUTS`, which says what was found and
where), the 788 modules of SDXL's UNet (or the same module kinds of another UNet config) at
rank 64, filled with small random values: a fused copy draws measurably different images and
stays finite. Shapes come from the UNet built on the ``meta`` device: no weight is made.

Values: each down projection is normal with std ``1 / sqrt(fan_in)`` (a unit-gain map of the
layer's input), each up projection normal with std ``std`` (default 0.01), so a layer's
output moves by about ``std * sqrt(rank)`` of its input's scale (8 % at rank 64).

Example::

    python -m bench.gpu.turbo_lora_file --kind lcm --out /tmp/lcm.safetensors
    python -m bench.gpu.turbo_lora_file --kind hyper-sd --out hyper.safetensors \\
        --config unet.json --rank 8            # any UNet config (a diffusers unet/config.json)

    from bench.gpu.turbo_lora_file import write_turbo_lora
    write_turbo_lora(Path("lcm.safetensors"), "lcm", load_config("unet"))   # 394 MB
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.harness import finish, main, make_parser

SDXL_UNET_CONFIG = Path(__file__).resolve().parent / "sdxl" / "unet.json"
#: Families this writer writes (``kohya-sgm`` is read, but no published turbo LoRA uses it).
WRITTEN_FAMILIES = ("kohya", "diffusers", "peft")


def target_shapes(unet_config: Mapping[str, Any]) -> dict[str, tuple[int, int, tuple[int, ...]]]:
    """``{module: (out, in, kernel)}`` of the UNet modules a published turbo LoRA adapts
    (``kernel`` is ``()`` for a Linear layer), read from the UNet built on ``meta``."""
    import torch
    from diffusers import UNet2DConditionModel

    from genaug.service.pipeline.turbo_lora import PUBLISHED_TARGETS

    with torch.device("meta"):
        unet = UNet2DConditionModel.from_config(dict(unet_config))  # type: ignore[no-untyped-call]
    out: dict[str, tuple[int, int, tuple[int, ...]]] = {}
    for name, module in unet.named_modules():
        if not any(name == t or name.endswith("." + t) for t in PUBLISHED_TARGETS):
            continue
        if isinstance(module, torch.nn.Linear):
            out[name] = (module.out_features, module.in_features, ())
        elif isinstance(module, torch.nn.Conv2d):
            out[name] = (module.out_channels, module.in_channels // module.groups,
                         tuple(module.kernel_size))
    return out


def key_names(family: str, module: str) -> tuple[str, str, str | None]:
    """(down key, up key, alpha key or None) of ``module`` in a key family."""
    if family == "kohya":
        base = "lora_unet_" + module.replace(".", "_")
        return f"{base}.lora_down.weight", f"{base}.lora_up.weight", f"{base}.alpha"
    if family == "diffusers":
        return f"unet.{module}.lora.down.weight", f"unet.{module}.lora.up.weight", None
    if family == "peft":
        return f"unet.{module}.lora_A.weight", f"unet.{module}.lora_B.weight", None
    raise ValueError(f"no writer for the {family!r} layout; write one of: "
                     f"{', '.join(WRITTEN_FAMILIES)}")


def write_turbo_lora(
    path: Path,
    kind: str,
    unet_config: Mapping[str, Any],
    *,
    rank: int = 64,
    seed: int = 0,
    std: float = 0.01,
    alpha: float | None = None,
    layout: str | None = None,
) -> Path:
    """Write ``path``: a synthetic LoRA in ``kind``'s published layout for the UNet of
    ``unet_config`` (a diffusers ``UNet2DConditionModel`` config; SDXL's is
    ``bench/gpu/sdxl/unet.json``). ``alpha`` (kohya layouts: the ``.alpha`` written, default
    the rank, as the LCM-LoRA file has it) and ``layout`` (another family than the kind's,
    :data:`WRITTEN_FAMILIES`) vary what the tests read. Returns ``path``."""
    import torch
    from safetensors.torch import save_file

    from genaug.service.pipeline.turbo_lora import PUBLISHED_LAYOUTS

    if kind not in PUBLISHED_LAYOUTS:
        raise ValueError(f"unknown turbo LoRA kind {kind!r}; use one of: "
                         f"{', '.join(PUBLISHED_LAYOUTS)}")
    published = PUBLISHED_LAYOUTS[kind]
    family = layout or published.family
    dtype = getattr(torch, published.dtype)
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for module, (out, fan_in, kernel) in target_shapes(unet_config).items():
        down_key, up_key, alpha_key = key_names(family, module)
        receptive = fan_in * math.prod(kernel)
        down = torch.randn((rank, fan_in, *kernel), generator=generator)
        up = torch.randn((out, rank, *((1, 1) if kernel else ())), generator=generator)
        tensors[down_key] = (down / math.sqrt(receptive)).to(dtype)
        tensors[up_key] = (up * std).to(dtype)
        if alpha_key is not None and published.alpha:
            tensors[alpha_key] = torch.tensor(float(alpha or rank), dtype=dtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"genaug_synthetic_turbo_lora": kind})
    return path


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    from genaug.service.pipeline.turbo_lora import PUBLISHED_LAYOUTS

    p = make_parser((__doc__ or "").split("\n\n")[0], quick=False, threads=False)
    p.add_argument("--kind", required=True, choices=tuple(PUBLISHED_LAYOUTS))
    p.add_argument("--out", type=Path, required=True, help="the .safetensors file to write")
    p.add_argument("--config", type=Path, default=SDXL_UNET_CONFIG,
                   help="a UNet config.json (default: SDXL's, bench/gpu/sdxl/unet.json)")
    p.add_argument("--rank", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--std", type=float, default=0.01, help="std of the up projections")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    config = json.loads(args.config.read_text())
    path = write_turbo_lora(args.out, args.kind, config, rank=args.rank, seed=args.seed,
                            std=args.std)
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        keys = list(handle.keys())
    result = {"benchmark": "turbo_lora_file", "kind": args.kind, "file": str(path),
              "config": str(args.config), "rank": args.rank, "tensors": len(keys),
              "layers": sum(k.endswith(("lora_down.weight", "lora.down.weight",
                                        "lora_A.weight")) for k in keys),
              "bytes": path.stat().st_size, "seconds": time.perf_counter() - t0}
    print(f"wrote {path}: {result['layers']} {args.kind} LoRA layers of rank {args.rank}, "
          f"{result['bytes'] / 1e6:.1f} MB in {result['seconds']:.1f} s", flush=True)
    return finish(result, args.json)


if __name__ == "__main__":
    main(run)
