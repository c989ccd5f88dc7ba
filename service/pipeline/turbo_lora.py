"""Turbo LoRAs: a few-step distillation of SDXL, read in its published layout and fused into a
second copy of the UNet.

``GENAUG_TURBO_LORA`` names one file of a published few-step distillation of the SDXL base
(``GENAUG_TURBO_KIND`` says which: :data:`TURBO_KINDS`, the scheduler, guidance and steps it
draws with). :func:`read_turbo_lora` reads it with ``safetensors`` (never unpickled) and turns
its UNet weights into the layout ``UNet2DConditionModel.load_lora_adapter`` takes, through
diffusers' own converters; :func:`fuse_turbo_unet` adds them into a deep copy of the served
UNet.

**Design: a second, fused UNet.** The copy holds ``W + scale * B @ A`` in each adapted layer
and is plain ``nn.Linear`` / ``nn.Conv2d`` afterwards: no peft layer, no adapter config.

- Quality images stay bit-identical: the served UNet is never touched (no layers injected
  at scale 0, no merge and unmerge whose rounding would drift its weights).
- Switching modes costs nothing: a batch runs one of two UNets (its key carries its speed),
  nothing is copied or rescaled between batches, and a compiled graph of one never sees the
  other change.
- FP8 (``GENAUG_QUANTIZE=fp8``) and compiling treat the copy like any UNet: plain weights.

The price is memory: a second UNet on the device. SDXL's has 2,567,463,684 parameters:
**5.1 GB more in bfloat16** (10.3 GB in float32) beside the first. The LoRA itself (196.8 M
parameters at rank 64, 0.39 GB in float16) is read on the CPU and can be dropped once fused;
while fusing, one adapted weight at a time is also held in float32 (SDXL's largest, a
1280 -> 10240 projection, 52 MB).

**The published layouts** (what :func:`read_turbo_lora` converts, what
``bench/gpu/turbo_lora_file.py`` writes for tests and benchmarks; :data:`PUBLISHED_LAYOUTS`).
Every one adapts the same 788 modules of the SDXL UNet at rank 64, the 14 module kinds of
:data:`PUBLISHED_TARGETS` (attention projections, transformer feed-forwards and
``proj_in``/``proj_out``, resnet convolutions, shortcuts and time projections, down- and
upsamplers; not ``conv_in``, ``conv_out`` or the time and added-condition embeddings), and
none carries text-encoder weights:

- ``lcm``, latent-consistency/lcm-lora-sdxl ``pytorch_lora_weights.safetensors``: kohya key
  names over diffusers module paths
  (``lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_q.lora_down.weight``,
  ``.lora_up.weight``, ``.alpha``), alpha 64 (scale 1), float16. *Established* from the LCM
  team's training script (luosiallen/latent-consistency-model,
  ``LCM_Training_Script/consistency_distillation/train_lcm_distill_lora_sdxl_wds.py``, also
  diffusers' ``examples/consistency_distillation``): peft LoRA of rank 64, alpha 64 on the
  module kinds above, turned into kohya keys by its ``get_module_kohya_state_dict``
  (``lora_A`` -> ``lora_down``, ``lora_B`` -> ``lora_up``, dots -> underscores, a 0-d
  ``.alpha`` per module, in the training dtype), which its validation loads into the
  pipeline (its end-of-training save writes peft keys under ``unet.base_model.model.``,
  which diffusers cannot load: not the published file). Those 788 modules at rank 64 are
  196,751,360 parameters, 393.5 MB in float16: the published file's 394 MB.
  stable-diffusion.cpp's LoRA refactor (leejet/stable-diffusion.cpp PR #955) lists its
  sibling lcm-lora-sdv1-5 as ``unet|lora_down+lora_up+alpha|hf``: UNet only, kohya
  down/up/alpha, diffusers names.
- ``lightning``, ByteDance/SDXL-Lightning ``sdxl_lightning_{2,4,8}step_lora.safetensors``:
  394 MB, the same 788 modules at rank 64 in float16 (no other module set fits the size: the
  transformer blocks' layers alone are 340.5 MB, every Linear and Conv2d 395.3 MB). Its key
  names could not be read here (no copy of the file or its header was reachable); *assumed*
  kohya names over diffusers paths with ``.alpha`` (alpha = rank): its card ships it "for
  Diffusers and ComfyUI", A1111/Forge users load it as an ordinary LoRA
  (sandner.art/sdxl-lightning-how-to-use-it-for-the-best-details), whose loader matches
  kohya names, and its module set is the LCM-LoRA script's.
- ``hyper-sd``, ByteDance/Hyper-SD ``Hyper-SDXL-{1step,2steps,4steps,8steps}-lora`` (and the
  8/12-step CFG ones): 787 MB (the size download lists give for it),
  the same 788 modules at rank 64 in **float32** (787.0 MB). Key names not read here either;
  *assumed* kohya over diffusers paths with ``.alpha`` by analogy (the LCM-LoRA module set;
  loaded as an ordinary LoRA by diffusers, ComfyUI and Fooocus, lllyasviel/Fooocus PR #2812).
- ``tcd``, h1t/TCD-SDXL-LoRA ``pytorch_lora_weights.safetensors``: distilled the LCM-LoRA
  way (TCD builds on LCM; the same file name diffusers' LoRA scripts write); *assumed* the
  LCM-LoRA file's layout (kohya, ``.alpha``, float16), nothing seen here shows its keys.

Where a layout is assumed, nothing depends on it being right: :func:`read_turbo_lora` reads
every family diffusers converts (kohya with diffusers or SGM names, diffusers
``unet.<module>.lora.down.weight``, peft ``unet.<module>.lora_A.weight``) for every kind;
a file in another family than its kind's is read with a log line saying so. The tests read
all of them.

Example::

    state = read_turbo_lora(Path("lcm-lora-sdxl.safetensors"), "lcm")
    turbo_unet = fuse_turbo_unet(pipeline.unet, state)   # pipeline.unet unchanged
    TURBO_KINDS["lcm"].scheduler                        # "lcm": 4 steps, no guidance
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from ..sampling.modes import TURBO_KINDS, TurboKind
from .quiet import quiet_diffusers

if TYPE_CHECKING:
    import torch

__all__ = ["PUBLISHED_LAYOUTS", "PUBLISHED_TARGETS", "TURBO_KINDS", "PublishedLayout",
           "TurboKind", "TurboLoraError", "fuse_turbo_unet", "layout_family",
           "read_turbo_lora"]

log = logging.getLogger(__name__)

#: The module kinds every published turbo LoRA adapts (a UNet module whose path ends with one
#: of these): the LCM-LoRA training script's default ``lora_target_modules``.
PUBLISHED_TARGETS: tuple[str, ...] = (
    "to_q", "to_k", "to_v", "to_out.0", "proj_in", "proj_out", "ff.net.0.proj", "ff.net.2",
    "conv1", "conv2", "conv_shortcut", "downsamplers.0.conv", "upsamplers.0.conv",
    "time_emb_proj",
)

#: Key families, as :func:`layout_family` names them.
FAMILIES = ("kohya", "kohya-sgm", "diffusers", "peft")


@dataclass(frozen=True)
class PublishedLayout:
    """How a kind's published file names and stores its UNet LoRA (module docstring).

    ``family``: ``"kohya"`` (``lora_unet_`` + the diffusers module path, dots as
    underscores, ``.lora_down.weight`` / ``.lora_up.weight``), ``"kohya-sgm"`` (the same
    over SGM paths, ``lora_unet_input_blocks_4_1_...``), ``"diffusers"``
    (``unet.<module>.lora.down.weight``) or ``"peft"`` (``unet.<module>.lora_A.weight``);
    ``alpha``: a 0-d ``.alpha`` per module; ``established``: read from the file's source, not
    assumed. Example::

        PUBLISHED_LAYOUTS["hyper-sd"].dtype   # "float32": 787 MB at rank 64
    """

    file: str
    family: str
    alpha: bool
    dtype: str
    rank: int
    established: bool


#: Each kind's published file (module docstring: what was found and where).
PUBLISHED_LAYOUTS: dict[str, PublishedLayout] = {
    "lcm": PublishedLayout("latent-consistency/lcm-lora-sdxl pytorch_lora_weights.safetensors",
                           "kohya", True, "float16", 64, True),
    "lightning": PublishedLayout("ByteDance/SDXL-Lightning sdxl_lightning_4step_lora"
                                 ".safetensors", "kohya", True, "float16", 64, False),
    "hyper-sd": PublishedLayout("ByteDance/Hyper-SD Hyper-SDXL-4steps-lora.safetensors",
                                "kohya", True, "float32", 64, False),
    "tcd": PublishedLayout("h1t/TCD-SDXL-LoRA pytorch_lora_weights.safetensors",
                           "kohya", True, "float16", 64, False),
}
assert set(PUBLISHED_LAYOUTS) == set(TURBO_KINDS)

_SGM_BLOCKS = ("input_blocks", "middle_block", "output_blocks")
_KOHYA_PREFIXES = ("lora_unet_", "lora_te_", "lora_te1_", "lora_te2_")


class TurboLoraError(ValueError):
    """A turbo LoRA that cannot be read or does not fit the served UNet; the message (one line)
    names the file or key, what is wrong and the fix."""


def layout_family(keys: Any) -> str:
    """The key family of a LoRA state dict's keys (:data:`FAMILIES`), ``"unknown"`` when none.

    Example::

        layout_family(["lora_unet_mid_block_attentions_0_proj_in.alpha"])   # "kohya"
    """
    names = list(keys)
    if names and all(k.startswith(_KOHYA_PREFIXES) for k in names):
        unet = [k for k in names if k.startswith("lora_unet_")]
        return "kohya-sgm" if any(b in k for k in unet for b in _SGM_BLOCKS) else "kohya"
    if any(".lora_A." in k or ".lora_B." in k for k in names):
        return "peft"
    if any(".lora.down." in k or "_lora.down." in k or ".lora_linear_layer." in k
           for k in names):
        return "diffusers"
    return "unknown"


def read_turbo_lora(
    path: Path, kind: str, *, unet_config: Mapping[str, Any] | None = None
) -> dict[str, torch.Tensor]:
    """The file's UNet LoRA weights in the layout ``UNet2DConditionModel.load_lora_adapter``
    takes: ``unet.<module>.lora_A.weight`` / ``.lora_B.weight`` (load them with
    ``prefix="unet"``), alphas folded into ``lora_B`` (``alpha / rank``), so every layer's
    scale is 1, the convention of a state dict without alphas.

    The file's keys are converted from their layout (module docstring) by diffusers' own
    converters: ``StableDiffusionXLPipeline.lora_state_dict`` (kohya names: its
    ``_convert_non_diffusers_lora_to_diffusers``; SGM block names need ``unet_config``, the
    served UNet's config, for its ``layers_per_block``) and ``convert_unet_state_dict_to_peft``.
    Text-encoder weights are dropped with a log line: turbo fuses the UNet only. Read with
    ``safetensors``, never unpickled.

    Raises:
        TurboLoraError: an unknown ``kind`` (naming the kinds), a file that is missing or not
            safetensors, keys diffusers cannot convert, or no UNet LoRA weights in it.
    """
    import torch
    from diffusers import StableDiffusionXLPipeline
    from diffusers.utils import convert_unet_state_dict_to_peft  # type: ignore[attr-defined]

    if kind not in TURBO_KINDS:
        raise TurboLoraError(
            f"unknown turbo LoRA kind {kind!r}; use one of: {', '.join(TURBO_KINDS)} "
            "(GENAUG_TURBO_KIND: the distillation the file is, its keys do not say)")
    published = PUBLISHED_LAYOUTS[kind]
    where = f"turbo LoRA {str(path)!r} (GENAUG_TURBO_LORA, kind {kind})"
    raw = _load(where, Path(path), published)
    family = layout_family(raw)
    if family != published.family:
        log.info("%s is in the %s layout, the published %s file in the %s layout: reading it "
                 "anyway", where, family, kind, published.family)
    if family == "kohya-sgm" and unet_config is None:
        raise TurboLoraError(
            f"{where} names SGM blocks (e.g. {_few([k for k in raw if 'input_blocks' in k])}): "
            "mapping them needs the UNet's layers_per_block; pass unet_config=unet.config")
    config = SimpleNamespace(**dict(unet_config)) if unet_config is not None else None
    try:
        with quiet_diffusers():
            converted, alphas = StableDiffusionXLPipeline.lora_state_dict(
                dict(raw), unet_config=config)
    except Exception as exc:  # diffusers raises ValueError/KeyError/IndexError for odd keys
        detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise TurboLoraError(
            f"{where} has keys diffusers cannot convert ({type(exc).__name__}: {detail}), "
            f"e.g. {_few(sorted(raw))}; it must be an SDXL UNet LoRA in kohya, diffusers or "
            f"peft layout, like {published.file}") from exc
    unet_keys = {k.removeprefix("unet."): v for k, v in converted.items()
                 if k.startswith("unet.")}
    text = sorted(k for k in converted if k.startswith("text_encoder"))
    if text:
        log.info("%s: dropped %d text-encoder LoRA tensors (turbo fuses the UNet only), e.g. %s",
                 where, len(text), _few(text, 2))
    if not unet_keys:
        other = sorted(k for k in converted if not k.startswith(("unet.", "text_encoder")))
        found = (f"only {len(text)} text-encoder tensors, e.g. {_few(text, 2)}" if text and
                 not other else f"keys e.g. {_few(other or text or sorted(raw), 3)}")
        raise TurboLoraError(
            f"{where} holds no UNet LoRA weights ({found}); point GENAUG_TURBO_LORA at the "
            f"distillation's UNet LoRA, like {published.file}")
    # Alphas a diffusers-layout file may carry beside its weights, as kohya's are reported.
    alpha_of = {k.removesuffix(".alpha"): float(v) for k, v in unet_keys.items()
                if k.endswith(".alpha")}
    alpha_of.update({k.removeprefix("unet.").removesuffix(".alpha"): float(v)
                     for k, v in (alphas or {}).items() if k.startswith("unet.")})
    weights = {k: v for k, v in unet_keys.items() if not k.endswith(".alpha")}
    peft: dict[str, Any] = convert_unet_state_dict_to_peft(weights)  # type: ignore[no-untyped-call]
    odd = sorted(k for k in peft if not k.endswith((".lora_A.weight", ".lora_B.weight")))
    if odd:
        raise TurboLoraError(
            f"{where} holds UNet tensors that are not plain LoRA down/up weights (DoRA "
            f"magnitudes, LoRA biases, ...), e.g. {_few(odd)}; turbo fuses plain LoRAs only")
    scales = {_module_of_alpha(name, convert_unet_state_dict_to_peft): alpha
              for name, alpha in alpha_of.items()}
    out: dict[str, torch.Tensor] = {}
    for key, value in peft.items():
        module = key.rsplit(".lora_", 1)[0]
        if key.endswith(".lora_B.weight") and module in scales:
            rank = int(value.shape[1])
            scale = scales[module] / rank
            if scale != 1.0:
                value = (value.to(torch.float32) * scale).to(value.dtype)
        out[f"unet.{key}"] = value
    log.info("read %s: %d UNet LoRA layers (%s layout, rank %s)", where, len(out) // 2,
             family, _ranks(out))
    return out


def fuse_turbo_unet(
    unet: torch.nn.Module, state: Mapping[str, torch.Tensor], *, scale: float = 1.0
) -> torch.nn.Module:
    """A deep copy of ``unet`` with the LoRA ``state`` (:func:`read_turbo_lora`'s layout; keys
    with or without the ``unet.`` prefix) fused into its weights: ``W + scale * B @ A``,
    computed in float32 and stored in the weight's dtype. The copy's adapted layers stay plain
    ``nn.Linear`` / ``nn.Conv2d`` (no peft layer, no adapter config), on ``unet``'s device and
    in its dtype; ``unet`` itself is left bit-identical.

    Every key is checked against ``unet`` before anything is copied. Fuse before adapters
    (``GENAUG_LORAS``) are injected and before the UNet is compiled: a UNet carrying peft
    layers is refused.

    Raises:
        TurboLoraError: a key that is not a LoRA down/up weight or lacks its pair, names a
            module ``unet`` lacks or one that is neither Linear nor Conv2d, or a shape that
            does not fit (the key, expected vs got: a LoRA for another base model).
    """
    import torch

    pairs = _pairs(state)
    _check_plain(unet)
    modules = dict(unet.named_modules())
    for name, (down, up) in pairs.items():
        _check_fits(name, modules.get(name), down, up)
    fused = copy.deepcopy(unet)
    for attribute in ("peft_config", "_hf_peft_config_loaded"):
        fused.__dict__.pop(attribute, None)
    targets = dict(fused.named_modules())
    with torch.no_grad():
        for name, (down, up) in pairs.items():
            weight = targets[name].weight
            delta = _delta(down, up, weight.device)
            weight.copy_((weight.to(torch.float32) + scale * delta.view(weight.shape))
                         .to(weight.dtype))
    log.info("fused a turbo LoRA of %d layers (rank %s, scale %g) into a copy of the UNet",
             len(pairs), _ranks({f"{n}.lora_B.weight": up for n, (_, up) in pairs.items()}),
             scale)
    return fused


# -- reading --------------------------------------------------------------------------------


def _load(where: str, path: Path, published: PublishedLayout) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if not path.is_file():
        raise TurboLoraError(
            f"{where} does not exist; set GENAUG_TURBO_LORA to the distillation's "
            f"safetensors file, like {published.file}")
    try:
        return dict(load_file(str(path)))
    except Exception as exc:  # safetensors raises SafetensorError, OSError, ValueError
        raise TurboLoraError(
            f"{where} is not a safetensors file ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:120] if str(exc) else ''}); turbo LoRAs load from "
            "safetensors only (pickled .bin/.pt files can run code): download the "
            f".safetensors file, like {published.file}, or convert it once where you trust it"
        ) from exc


def _module_of_alpha(name: str, to_peft: Any) -> str:
    """The peft module path of an alpha as diffusers reports it: ``<module>`` for most layers,
    ``<...>.processor.to_q_lora.down.weight`` for attention projections."""
    down = name if name.endswith(".weight") else f"{name}.lora.down.weight"
    (key,) = to_peft({down: None})
    module: str = key.rsplit(".lora_", 1)[0]
    return module


def _ranks(state: Mapping[str, Any]) -> str:
    ranks = sorted({int(v.shape[1]) for k, v in state.items() if k.endswith(".lora_B.weight")})
    return "/".join(str(r) for r in ranks) or "-"


def _few(names: list[str], limit: int = 3) -> str:
    if not names:
        return "none"
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")


# -- fusing ---------------------------------------------------------------------------------


def _pairs(state: Mapping[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{module: (lora_A, lora_B)}`` of a :func:`read_turbo_lora` state dict."""
    downs: dict[str, torch.Tensor] = {}
    ups: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        name = key.removeprefix("unet.")
        if name.endswith(".lora_A.weight"):
            downs[name.removesuffix(".lora_A.weight")] = value
        elif name.endswith(".lora_B.weight"):
            ups[name.removesuffix(".lora_B.weight")] = value
        else:
            raise TurboLoraError(
                f"turbo LoRA key {key!r} is not a LoRA down/up weight "
                "(<module>.lora_A.weight / .lora_B.weight); read the file with "
                "read_turbo_lora, which converts the published layouts")
    unpaired = sorted(set(downs) ^ set(ups))
    if unpaired:
        raise TurboLoraError(
            f"turbo LoRA layers lack their down or up weight: {_few(unpaired)}; the file is "
            "cut short or not a LoRA: download it again")
    if not downs:
        raise TurboLoraError("the turbo LoRA holds no layers; read_turbo_lora refuses such "
                             "files: read it with read_turbo_lora")
    return {name: (downs[name], ups[name]) for name in sorted(downs)}


def _check_plain(unet: torch.nn.Module) -> None:
    """Refuse a UNet carrying peft layers: their copies would keep the adapters."""
    layered = [name for name, module in unet.named_modules()
               if hasattr(module, "lora_A") and hasattr(module, "base_layer")]
    if layered:
        raise TurboLoraError(
            f"the UNet carries LoRA adapter layers (e.g. {_few(layered, 2)}); fuse the turbo "
            "LoRA into the plain base UNet, before GENAUG_LORAS adapters are loaded")


def _check_fits(
    name: str, module: torch.nn.Module | None, down: torch.Tensor, up: torch.Tensor
) -> None:
    import torch

    key = f"unet.{name}.lora_A.weight"
    hint = "the LoRA is for another base model than the served UNet (turbo LoRAs are SDXL's)"
    if module is None:
        raise TurboLoraError(f"turbo LoRA key {key!r} names module {name!r}, which the UNet "
                             f"lacks; {hint}")
    rank = int(down.shape[0]) if down.dim() else 0
    if isinstance(module, torch.nn.Linear):
        want_down: tuple[int, ...] = (rank, module.in_features)
        want_up: tuple[int, ...] = (module.out_features, rank)
    elif isinstance(module, torch.nn.Conv2d):
        want_down = (rank, module.in_channels // module.groups, *module.kernel_size)
        want_up = (module.out_channels, rank, 1, 1)
    else:
        raise TurboLoraError(f"turbo LoRA key {key!r} names {name!r}, a "
                             f"{type(module).__name__}, not a Linear or Conv2d layer; {hint}")
    for which, tensor, want in (("lora_A", down, want_down), ("lora_B", up, want_up)):
        if tuple(tensor.shape) != want:
            raise TurboLoraError(
                f"turbo LoRA key unet.{name}.{which}.weight has shape {tuple(tensor.shape)}, "
                f"the UNet's {type(module).__name__} {name!r} needs {want}; {hint}")


def _delta(down: torch.Tensor, up: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``B @ A`` in float32 on ``device``, flat (out, in * kernel): Linear and Conv2d alike
    (a convolution's up projection is 1x1, so its delta is the same product)."""
    import torch

    a = down.to(device=device, dtype=torch.float32).flatten(1)
    b = up.to(device=device, dtype=torch.float32).flatten(1)
    return b @ a
