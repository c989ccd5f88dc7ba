"""Which attention kernel ``scaled_dot_product_attention`` uses (``GENAUG_ATTENTION``), chosen
when the model loads and reported in ``/v1/info``'s ``acceleration``.

diffusers' SDXL attention processors call ``torch.nn.functional.scaled_dot_product_attention``;
torch picks a kernel per call from an ordered list of backends (by default flash, efficient,
math, cuDNN). The choices:

- ``auto`` (the default): on a CUDA GPU of compute capability 9.0 or more (Hopper, Blackwell),
  FlashAttention-3 when its package is installed (``flash_attn_interface``, activated through
  ``torch.nn.attention.activate_flash_attention_impl("FA3")``), else cuDNN attention when
  cuDNN is available, put first in torch's order (the others stay behind it, for shapes it
  cannot take). Elsewhere (older GPUs, the CPU) torch's own order: ``default``.
- ``default``: torch's own order, untouched.
- ``flash3``, ``cudnn``, ``flash``, ``efficient``, ``math``: that kernel only (a shape it cannot
  take is an error, not a silent fallback); ``flash3``, ``cudnn`` and ``efficient`` are
  refused in one line on the CPU.

The backend flags are process-wide in torch: one service per process, as genaug runs.
:func:`apply_attention` returns the function that restores what it changed.

Example::

    choice = choose_attention("auto", torch.device("cuda:0"))  # AttentionChoice("auto", "cudnn")
    undo = apply_attention(choice)
    choice.backend                                           # "cudnn": what /v1/info reports
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .errors import AccelerationError

if TYPE_CHECKING:
    import torch

__all__ = ["ATTENTION_CHOICES", "AttentionChoice", "apply_attention", "choose_attention"]

log = logging.getLogger(__name__)

AttentionSetting = Literal["auto", "default", "flash3", "cudnn", "flash", "efficient", "math"]
ATTENTION_CHOICES: tuple[AttentionSetting, ...] = (
    "auto", "default", "flash3", "cudnn", "flash", "efficient", "math"
)
_CUDA_ONLY = ("flash3", "cudnn", "efficient")
# FlashAttention-3's kernels are written for Hopper (sm90).
_FA3_CAPABILITY = (9, 0)
_FA3_MODULE = "flash_attn_interface"
# torch's own order of attention kernels (torch/csrc: flash, efficient, math, cuDNN, then a
# backend's override): what "default" restores.
_TORCH_ORDER = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH", "CUDNN_ATTENTION",
                "OVERRIDEABLE")


@dataclass(frozen=True)
class AttentionChoice:
    """The setting and the backend it resolved to on this device (``default``: torch's own
    order)."""

    setting: str
    backend: str


def choose_attention(setting: str, device: torch.device) -> AttentionChoice:
    """Resolve ``GENAUG_ATTENTION`` on ``device``.

    Raises:
        AccelerationError: an unknown name, a CUDA-only kernel on the CPU, FlashAttention-3 on a
            GPU that is not Hopper or without its package, cuDNN attention without cuDNN.
    """
    import torch

    if setting not in ATTENTION_CHOICES:
        raise AccelerationError(
            f"attention {setting!r} is not one of {', '.join(ATTENTION_CHOICES)}; set "
            "GENAUG_ATTENTION to one of those"
        )
    if setting == "default":
        return AttentionChoice(setting, "default")
    capability: tuple[int, int] | None = None
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        capability = (major, minor)
    if setting == "auto":
        if capability is None or capability < (9, 0):
            return AttentionChoice(setting, "default")
        if capability[0] == _FA3_CAPABILITY[0] and _fa3_installed():
            return AttentionChoice(setting, "flash3")
        if _cudnn_available():
            return AttentionChoice(setting, "cudnn")
        return AttentionChoice(setting, "default")
    has = "no compute capability (not a CUDA GPU)" if capability is None else (
        f"compute capability {capability[0]}.{capability[1]}")
    if setting in _CUDA_ONLY and capability is None:
        raise AccelerationError(
            f"GENAUG_ATTENTION={setting} is a CUDA kernel; {device} has {has}. Set "
            "GENAUG_ATTENTION=auto (or flash or math on the CPU)"
        )
    if setting == "flash3":
        if capability is None or capability[0] != _FA3_CAPABILITY[0]:
            raise AccelerationError(
                f"GENAUG_ATTENTION=flash3 (FlashAttention-3) runs on Hopper GPUs (compute "
                f"capability 9.x); {device} has {has}. Set GENAUG_ATTENTION=auto"
            )
        if not _fa3_installed():
            raise AccelerationError(
                f"GENAUG_ATTENTION=flash3 needs FlashAttention-3 ({_FA3_MODULE}, built from "
                "flash-attention's hopper/ folder), which is not installed, and a torch that "
                "can activate it; install it, or set GENAUG_ATTENTION=auto"
            )
    if setting == "cudnn" and not _cudnn_available():
        raise AccelerationError(
            "GENAUG_ATTENTION=cudnn needs cuDNN, which this torch build cannot use; set "
            "GENAUG_ATTENTION=auto"
        )
    return AttentionChoice(setting, setting)


def _cudnn_available() -> bool:
    import torch

    return bool(torch.backends.cudnn.is_available())  # type: ignore[no-untyped-call]


def _code(backend: Any) -> int:
    """An ``SDPBackend`` as the int torch's priority order holds."""
    return int(backend)


def _fa3_installed() -> bool:
    import torch.nn.attention as attention

    if not hasattr(attention, "activate_flash_attention_impl"):
        return False
    if "FA3" not in attention.list_flash_attention_impls():
        return False
    return importlib.util.find_spec(_FA3_MODULE) is not None


def apply_attention(choice: AttentionChoice) -> Callable[[], None]:
    """Make ``choice`` torch's attention kernel (process-wide); return the undo.

    Every call starts from torch's own state (all kernels enabled, torch's order, its own
    flash kernel), so a ``default`` after another choice in the same process (the benchmark
    runs several) is torch's choice again, not what the last one left.
    """
    import torch
    from torch.nn.attention import SDPBackend

    cuda = torch.backends.cuda
    flags = {
        SDPBackend.FLASH_ATTENTION: (cuda.flash_sdp_enabled, cuda.enable_flash_sdp),
        SDPBackend.EFFICIENT_ATTENTION: (cuda.mem_efficient_sdp_enabled,
                                         cuda.enable_mem_efficient_sdp),
        SDPBackend.MATH: (cuda.math_sdp_enabled, cuda.enable_math_sdp),
        SDPBackend.CUDNN_ATTENTION: (cuda.cudnn_sdp_enabled, cuda.enable_cudnn_sdp),
    }
    before = {b: bool(enabled()) for b, (enabled, _) in flags.items()}  # type: ignore[no-untyped-call]
    order_before = [_code(b) for b in torch._C._get_sdp_priority_order()]
    impl_before = _flash_impl()

    def set_state(enabled: dict[Any, bool], order: list[int], impl: str | None) -> None:
        if _flash_impl() != impl:
            if impl is None:
                torch.nn.attention.restore_flash_attention_impl()
            else:
                torch.nn.attention.activate_flash_attention_impl(impl)
        for backend, (_, enable) in flags.items():
            enable(enabled[backend])
        torch._C._set_sdp_priority_order(order)

    torch_order = [_code(getattr(SDPBackend, name)) for name in _TORCH_ORDER]
    set_state(dict.fromkeys(flags, True), torch_order, None)
    if choice.backend != "default":
        by_name = {
            "flash3": SDPBackend.FLASH_ATTENTION,  # FA3 takes the flash kernel's place
            "flash": SDPBackend.FLASH_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "math": SDPBackend.MATH,
        }
        first = by_name[choice.backend]
        if choice.setting == "auto":
            # First in the order; the others stay enabled behind it for shapes it cannot take.
            order = [_code(first), *(b for b in torch_order if b != _code(first))]
            set_state(dict.fromkeys(flags, True), order,
                      "FA3" if choice.backend == "flash3" else None)
        else:
            set_state({b: b == first for b in flags}, torch_order,
                      "FA3" if choice.backend == "flash3" else None)
    log.info("attention: %s (GENAUG_ATTENTION=%s)", choice.backend, choice.setting)
    return lambda: set_state(before, order_before, impl_before)


def _flash_impl() -> str | None:
    """The flash attention implementation activated in torch (``FA3``), or ``None``."""
    import torch.nn.attention as attention

    current = getattr(attention, "current_flash_attention_impl", None)
    return None if current is None else current()
