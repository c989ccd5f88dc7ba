"""FP8 for the UNet (``GENAUG_QUANTIZE=fp8``): its large linear layers in float8 with per-row
scales, through torchao; refused in one line where the device has no FP8.

torchao's float8 dynamic activation and weight configuration
(``Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())``) stores each chosen
layer's weight in ``float8_e4m3fn`` with one scale per output row, and quantizes each
activation row on the fly; the matrix product runs on the FP8 tensor cores
(``torch._scaled_mm``), which exist from compute capability 8.9 (Ada, Hopper, Blackwell).
Quantizing an activation costs a pass over it, so a layer pays only when its matrix product
is large: :func:`fp8_layer_filter` keeps the small ones, and those whose input is a few rows
per image, in bf16.

torchao is an optional extra (``pip install 'genaug[fp8]'``): nothing here imports it until
the option is used, and the service runs without it.

Example::

    check_fp8(torch.device("cuda:0"))       # raises SpeedError on a device without FP8
    layers = quantize_fp8(pipeline.unet)    # 'down_blocks.2.attentions.0...to_q', ...
    fp8_layer_filter(torch.nn.Linear(1280, 1280), "mid_block.attentions.0...to_q")  # True
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .errors import SpeedError

if TYPE_CHECKING:
    import torch

__all__ = [
    "FP8_MIN_CAPABILITY",
    "FP8_MIN_FEATURES",
    "FP8_SKIP_NAMES",
    "check_fp8",
    "fp8_layer_filter",
    "fp8_refusal",
    "load_torchao",
    "quantize_fp8",
]

log = logging.getLogger(__name__)

#: FP8 tensor cores (``torch._scaled_mm``) exist from compute capability 8.9 (Ada) on.
FP8_MIN_CAPABILITY = (8, 9)

#: A linear layer is quantized only when both its input features (K) and output features (N)
#: are at least this. Below it the per-row quantization of the activation (one more pass over
#: M x K) costs about what the faster FP8 product saves. 1024 follows torchao's own rowwise
#: auto-filter (measured by torchao on an H100 for training, where N <= 2048 or K <= 1024 is
#: skipped); for SDXL it keeps the 640-wide level in bf16 and quantizes the 1280-wide one,
#: where most of the UNet's linear FLOPs are. It has not been measured for genaug's inference
#: on a GPU yet: bench/gpu/gpu_sdxl.py's fp8 rows are the place to tune it.
FP8_MIN_FEATURES = 1024

#: Layers whose input is a few rows per image, not one per latent pixel: the time and added
#: embeddings (M = the UNet batch) and cross-attention's key and value projections of the
#: 77 text tokens. Their products are too small for FP8 to pay whatever their K and N.
FP8_SKIP_NAMES = (
    "time_embedding",
    "add_embedding",
    "time_emb_proj",
    "attn2.to_k",
    "attn2.to_v",
    "attn2.to_kv",
)

_EXTRA_HINT = "pip install 'genaug[fp8]' (torchao)"


def fp8_refusal(device: str, capability: tuple[int, int] | None, name: str = "") -> str | None:
    """Why ``device`` cannot run FP8 (one line naming it, its compute capability and the fix),
    or ``None`` when it can. ``capability`` is ``None`` for a device that is not CUDA."""
    if capability is not None and tuple(capability) >= FP8_MIN_CAPABILITY:
        return None
    what = f"{device} ({name})" if name else device
    has = "no compute capability (not a CUDA GPU)" if capability is None else (
        f"compute capability {capability[0]}.{capability[1]}")
    need = ".".join(str(x) for x in FP8_MIN_CAPABILITY)
    return (
        f"GENAUG_QUANTIZE=fp8 needs a CUDA GPU with compute capability {need} or more (Ada, "
        f"Hopper, Blackwell); {what} has {has}. Set GENAUG_QUANTIZE=none, or GENAUG_DEVICE "
        "to such a GPU"
    )


def check_fp8(device: torch.device) -> None:
    """Raise :class:`SpeedError` (one line) unless ``device`` has FP8 and torchao is
    installed."""
    import torch

    capability: tuple[int, int] | None = None
    name = ""
    if device.type == "cuda":
        capability = tuple(torch.cuda.get_device_capability(device))  # type: ignore[assignment]
        name = torch.cuda.get_device_name(device)
    refusal = fp8_refusal(str(device), capability, name)
    if refusal is not None:
        raise SpeedError(refusal)
    load_torchao()


def load_torchao() -> tuple[Any, Any, Any]:
    """torchao's ``quantize_``, ``Float8DynamicActivationFloat8WeightConfig`` and ``PerRow``;
    :class:`SpeedError` naming the extra to install when torchao is missing."""
    try:
        from torchao.quantization import (  # type: ignore[import-not-found,unused-ignore]
            Float8DynamicActivationFloat8WeightConfig,
            PerRow,
            quantize_,
        )
    except ImportError as exc:
        raise SpeedError(
            f"GENAUG_QUANTIZE=fp8 needs torchao, which is not installed ({exc}); "
            f"{_EXTRA_HINT}, or set GENAUG_QUANTIZE=none"
        ) from exc
    return quantize_, Float8DynamicActivationFloat8WeightConfig, PerRow


def fp8_layer_filter(
    module: torch.nn.Module, fqn: str, *, min_features: int = FP8_MIN_FEATURES
) -> bool:
    """Whether to quantize ``module`` (named ``fqn`` in the UNet): a ``torch.nn.Linear``
    with in and out features at least ``min_features`` and multiples of 16 (what the FP8
    product requires), not one of :data:`FP8_SKIP_NAMES`."""
    import torch

    if not isinstance(module, torch.nn.Linear):
        return False
    if any(part in fqn for part in FP8_SKIP_NAMES):
        return False
    k, n = module.in_features, module.out_features
    return k % 16 == 0 and n % 16 == 0 and min(k, n) >= min_features


def quantize_fp8(unet: torch.nn.Module, *, min_features: int = FP8_MIN_FEATURES) -> list[str]:
    """Quantize ``unet``'s chosen linear layers in place (:func:`fp8_layer_filter`); return
    their names. Call :func:`check_fp8` first (torchao refuses a device without FP8 with an
    assertion that names no setting)."""
    quantize_, config_class, per_row = load_torchao()
    chosen = [
        fqn for fqn, module in unet.named_modules()
        if fp8_layer_filter(module, fqn, min_features=min_features)
    ]
    if chosen:
        names = set(chosen)
        quantize_(
            unet,
            config_class(granularity=per_row()),
            filter_fn=lambda module, fqn: fqn in names,
        )
    log.info("FP8: %d linear layers of the UNet quantized (per-row scales)", len(chosen))
    return chosen
