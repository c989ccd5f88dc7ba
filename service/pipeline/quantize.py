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
the option is used, and the service runs without it. Its import-time noise is quieted by
:mod:`~genaug.service.pipeline.quiet`: torchao's own lines (libraries it could not load) are
held back and logged here, once, when FP8 is actually used: then they may matter; torch's
pytree deprecations and diffusers' torchao warning it causes are dropped.

FP8 needs a bfloat16 UNet (per-row scales are computed from bf16 weights); a float32 one is
refused in one line. ``skip`` keeps more layers in bf16 by name (e.g. the layer
``python -m bench.gpu.fp8_diagnose`` names as the first whose output goes non-finite).

Example::

    check_fp8(torch.device("cuda:0"))       # raises AccelerationError on a device without FP8
    layers = quantize_fp8(pipeline.unet)    # 'down_blocks.2.attentions.0...to_q', ...
    fp8_layer_filter(torch.nn.Linear(1280, 1280), "mid_block.attentions.0...to_q")  # True
    quantize_fp8(unet, skip=("up_blocks.0.",))  # the first up block's layers stay bf16
    fp8_layers(unet)                        # the names quantize_fp8 returned, or []
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .errors import AccelerationError
from .quiet import held_back

if TYPE_CHECKING:
    import torch

__all__ = [
    "FP8_ACTIVATION_LB",
    "FP8_MIN_CAPABILITY",
    "FP8_MIN_FEATURES",
    "FP8_SKIP_NAMES",
    "check_fp8",
    "fp8_layer_filter",
    "fp8_layers",
    "fp8_refusal",
    "load_torchao",
    "nonfinite_advice",
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

#: The least activation row maximum torchao divides by (``activation_value_lb``). Without it a
#: row of zeros gets a scale of 0 and quantizes to 0/0 = NaN, and SDXL has such rows on every
#: step with guidance: the unconditional half's text states are zeros
#: (``force_zeros_for_empty_prompt``), its cross-attention values (no bias) are zeros, so
#: each ``attn2.to_out`` sees rows of zeros. 1e-12 is torchao's own float8 training EPS.
FP8_ACTIVATION_LB = 1e-12

_EXTRA_HINT = "pip install 'genaug[fp8]' (torchao)"
# Where quantize_fp8 records, on the UNet itself, the names of the layers it quantized: the
# output guard and the reports read the model, not the settings it was made with.
_LAYERS_ATTR = "_genaug_fp8_layers"


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
    """Raise :class:`AccelerationError` (one line) unless ``device`` has FP8 and torchao is
    installed."""
    import torch

    capability: tuple[int, int] | None = None
    name = ""
    if device.type == "cuda":
        capability = tuple(torch.cuda.get_device_capability(device))  # type: ignore[assignment]
        name = torch.cuda.get_device_name(device)
    refusal = fp8_refusal(str(device), capability, name)
    if refusal is not None:
        raise AccelerationError(refusal)
    load_torchao()


def load_torchao() -> tuple[Any, Any, Any]:
    """torchao's ``quantize_``, ``Float8DynamicActivationFloat8WeightConfig`` and ``PerRow``;
    :class:`AccelerationError` naming the extra to install when torchao is missing."""
    try:
        from torchao.quantization import (  # type: ignore[import-not-found,unused-ignore]
            Float8DynamicActivationFloat8WeightConfig,
            PerRow,
            quantize_,
        )
    except ImportError as exc:
        raise AccelerationError(
            f"GENAUG_QUANTIZE=fp8 needs torchao, which is not installed ({exc}); "
            f"{_EXTRA_HINT}, or set GENAUG_QUANTIZE=none"
        ) from exc
    return quantize_, Float8DynamicActivationFloat8WeightConfig, PerRow


def fp8_layer_filter(
    module: torch.nn.Module,
    fqn: str,
    *,
    min_features: int | None = None,
    skip: Sequence[str] = (),
) -> bool:
    """Whether to quantize ``module`` (named ``fqn`` in the UNet): a ``torch.nn.Linear``
    with in and out features at least ``min_features`` (:data:`FP8_MIN_FEATURES` when
    ``None``) and multiples of 16 (what the FP8 product requires), whose name contains none
    of :data:`FP8_SKIP_NAMES` nor of ``skip``."""
    import torch

    if not isinstance(module, torch.nn.Linear):
        return False
    if any(part in fqn for part in (*FP8_SKIP_NAMES, *skip)):
        return False
    k, n = module.in_features, module.out_features
    least = FP8_MIN_FEATURES if min_features is None else min_features
    return k % 16 == 0 and n % 16 == 0 and min(k, n) >= least


def quantize_fp8(
    unet: torch.nn.Module,
    *,
    min_features: int | None = None,
    skip: Sequence[str] = (),
    config: Any = None,
    convs: bool = False,
) -> list[str]:
    """Quantize ``unet``'s chosen linear layers in place (:func:`fp8_layer_filter`); return
    their names (also recorded on ``unet``: :func:`fp8_layers`). Call :func:`check_fp8` first
    (torchao refuses a device without FP8 with an assertion that names no setting).

    ``config`` replaces the product's torchao configuration (per-row dynamic activation and
    weight); the diagnosis (``bench/gpu/fp8_diagnose.py``) passes per-tensor and weight-only
    ones. ``convs``: the UNet's 2-D convolutions too, each made an
    :class:`~genaug.service.pipeline.fp8_conv.Fp8Conv2d`
    (:func:`~genaug.service.pipeline.fp8_conv.fp8_conv_filter`, ``skip`` applies). Raises
    :class:`AccelerationError` when a chosen layer is not bfloat16.
    """
    import torch

    quantize_, config_class, per_row = load_torchao()
    for line in held_back("torchao", take=True):
        # torchao said this at import (FP8 off, held back by quiet.py); with FP8 on it matters:
        # a compiled kernel library that did not load changes which FP8 kernels run.
        log.warning("torchao at import: %s", line)
    layers = dict(unet.named_modules())
    chosen = [
        fqn for fqn, module in layers.items()
        if fp8_layer_filter(module, fqn, min_features=min_features, skip=skip)
    ]
    dtypes = {layers[fqn].weight.dtype for fqn in chosen}
    if dtypes - {torch.bfloat16}:
        found = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
        raise AccelerationError(
            f"GENAUG_QUANTIZE=fp8 quantizes bfloat16 layers (per-row scales); the UNet's are "
            f"{found}. Set GENAUG_DTYPE=bfloat16 (or auto on CUDA), or GENAUG_QUANTIZE=none"
        )
    if chosen:
        names = set(chosen)
        quantize_(
            unet,
            config if config is not None
            else config_class(granularity=per_row(), activation_value_lb=FP8_ACTIVATION_LB),
            filter_fn=lambda module, fqn: fqn in names,
        )
    conv_names = _quantize_convs(unet, tuple(skip)) if convs else []
    object.__setattr__(unet, _LAYERS_ATTR, [*chosen, *conv_names])
    log.info("FP8: %d linear layers%s of the UNet quantized (per-row scales)", len(chosen),
             f" and {len(conv_names)} convolutions" if convs else "")
    return [*chosen, *conv_names]


def _quantize_convs(unet: torch.nn.Module, skip: tuple[str, ...]) -> list[str]:
    """Replace each chosen convolution of ``unet`` by its FP8 form; their names."""
    import torch

    from .fp8_conv import Fp8Conv2d, fp8_conv_filter

    chosen = [fqn for fqn, module in unet.named_modules() if fp8_conv_filter(module, fqn, skip)]
    dtypes = {unet.get_submodule(fqn).weight.dtype for fqn in chosen}
    if dtypes - {torch.bfloat16}:
        found = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
        raise AccelerationError(
            f"GENAUG_QUANTIZE=fp8-conv quantizes bfloat16 convolutions; the UNet's are "
            f"{found}. Set GENAUG_DTYPE=bfloat16 (or auto on CUDA), or GENAUG_QUANTIZE=none")
    for fqn in chosen:
        parent, _, name = fqn.rpartition(".")
        owner = unet.get_submodule(parent) if parent else unet
        conv = unet.get_submodule(fqn)
        assert isinstance(conv, torch.nn.Conv2d)  # fp8_conv_filter chose it
        setattr(owner, name, Fp8Conv2d(conv, activation_lb=FP8_ACTIVATION_LB))
    return chosen


def fp8_layers(unet: Any) -> list[str]:
    """The layers :func:`quantize_fp8` quantized in ``unet`` ([] for a UNet it never saw)."""
    return list(getattr(unet, _LAYERS_ATTR, None) or [])


def nonfinite_advice(unet: Any) -> str:
    """The output guard's fix for an image whose latents came out NaN/Inf (the VAE already in
    float32), by what the UNet runs: FP8 layers first (their product is where a NaN starts
    when they are on), then its dtype."""
    layers = fp8_layers(unet)
    if layers:
        return (
            f"with GENAUG_QUANTIZE=fp8 ({len(layers)} UNet layers in float8) the UNet's "
            "latents are NaN/Inf; set GENAUG_QUANTIZE=none (python -m bench.gpu.fp8_diagnose "
            "names the first layer that goes non-finite)"
        )
    dtype = str(getattr(unet, "dtype", "")).removeprefix("torch.")
    if dtype == "float16":
        return "the UNet overflows in float16; use GENAUG_DTYPE=bfloat16 or float32"
    if dtype == "bfloat16":
        return "the UNet overflows in bfloat16; use GENAUG_DTYPE=float32"
    return (
        f"the UNet's latents are NaN/Inf in {dtype or 'its dtype'}; check the model's weights "
        "(GENAUG_MODEL, GENAUG_UNET_WEIGHTS)"
    )
