"""The torch device and dtype the pipeline runs on, its CPU thread count, and its identity.

``GENAUG_DEVICE`` and ``GENAUG_DTYPE`` become a :class:`torch.device` and a :class:`torch.dtype`
here (:func:`resolve_device`, :func:`resolve_dtype`); the lifespan checks them before anything
loads, and :func:`~genaug.service.pipeline.load.load_model` uses them. A bad value is a
:class:`ModelLoadError` (defined here, the lowest module of loading that raises it;
:mod:`~genaug.service.pipeline.load` re-exports it) naming the setting that fixes it.

Imported by the lifespan when the model loads (never by the routes: it imports torch).

Example::

    device = resolve_device("cuda")           # torch.device("cuda", 0): never the CPU instead
    resolve_dtype("auto", device)             # torch.bfloat16 (float32 on the CPU)
    threads = configure_threads(settings.torch_threads, torch.device("cpu"))
    identity(torch.device("cuda:0"))   # {"name": "cuda:0", "type": "cuda",
                                       #  "cuda_uuid": "GPU-...", "pci_bus_id": "00000000:65:00.0"}
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from .errors import ModelLoadError

__all__ = ["ModelLoadError", "configure_threads", "identity", "resolve_device", "resolve_dtype"]

log = logging.getLogger(__name__)

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def resolve_device(spec: str) -> torch.device:
    """Turn ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` into a usable :class:`torch.device`.

    ``"cuda"`` means the current CUDA device. A CUDA device that does not exist is an error
    (never a silent fallback to the CPU).

    Raises:
        ModelLoadError: unknown spec, CUDA unavailable, or index out of range.
    """
    text = spec.strip().lower()
    if text == "cpu":
        return torch.device("cpu")
    if text != "cuda" and not text.startswith("cuda:"):
        raise ModelLoadError(
            f"device {spec!r} is not supported; set GENAUG_DEVICE to 'cpu', 'cuda' or 'cuda:N'"
        )
    index: int | None = None
    if text.startswith("cuda:"):
        suffix = text.removeprefix("cuda:")
        if not suffix.isdigit():
            raise ModelLoadError(
                f"device {spec!r} is not a valid CUDA device; set GENAUG_DEVICE to 'cuda' or "
                "'cuda:N' with N a device index such as 0"
            )
        index = int(suffix)
    if not torch.cuda.is_available():
        reason = (
            "this torch build has no CUDA support"
            if torch.version.cuda is None
            else "no CUDA device is visible (check the driver and CUDA_VISIBLE_DEVICES)"
        )
        raise ModelLoadError(
            f"device {spec!r} requested but CUDA is not available: {reason} "
            f"(torch {torch.__version__}); available: cpu. Set GENAUG_DEVICE=cpu to run on "
            "the CPU, or run on a machine with a CUDA GPU"
        )
    count = torch.cuda.device_count()
    if index is None:
        index = torch.cuda.current_device()
    if index >= count:
        available = ", ".join(["cpu", *(f"cuda:{i}" for i in range(count))])
        raise ModelLoadError(
            f"device {spec!r} does not exist: {count} CUDA device(s) visible; available: "
            f"{available}. Set GENAUG_DEVICE to one of those"
        )
    return torch.device("cuda", index)


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    """Turn ``"auto"``, ``"float32"``, ``"bfloat16"`` or ``"float16"`` into a torch dtype.

    ``"auto"`` is bfloat16 on CUDA (no fp16 VAE overflow, full speed on Ampere and later)
    and float32 on the CPU. float16 on the CPU is refused: it is slow and poorly supported.

    Raises:
        ModelLoadError: unknown spec or float16 on the CPU.
    """
    text = spec.strip().lower()
    if text == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if text not in _DTYPES:
        raise ModelLoadError(
            f"dtype {spec!r} is not supported; set GENAUG_DTYPE to one of: auto, "
            + ", ".join(_DTYPES)
        )
    dtype = _DTYPES[text]
    if dtype == torch.float16 and device.type == "cpu":
        raise ModelLoadError(
            "dtype 'float16' is not supported on the CPU (slow, and many CPU kernels lack "
            "half precision); set GENAUG_DTYPE=float32 or GENAUG_DTYPE=bfloat16 "
            "(or 'auto'), or use a CUDA device"
        )
    return dtype




def configure_threads(requested: int | None, device: torch.device) -> int:
    """Set torch's intra-op thread count for the pipeline; return the count in force.

    ``requested`` wins. Unset, a CPU device gets all cores but one, so the event loop and the
    pool's store thread keep a core while a batch runs; a CUDA device keeps torch's default
    (its CPU threads only launch kernels).
    """
    if requested is None and device.type == "cpu":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        requested = max(1, (cores or os.cpu_count() or 1) - 1)
    if requested is not None and requested != torch.get_num_threads():
        torch.set_num_threads(requested)
        log.info("torch uses %d CPU threads", requested)
    return torch.get_num_threads()


def identity(device: torch.device) -> dict[str, Any]:
    """Name and type of ``device``; on CUDA also its UUID and PCI bus id in NVML's format
    (``GPU-<uuid>``, ``00000000:65:00.0``), which match ``nvidia-smi -q`` on the same host."""
    out: dict[str, Any] = {"name": str(device), "type": device.type}
    if device.type != "cuda":
        return out
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        text = str(uuid)
        out["cuda_uuid"] = text if text.startswith("GPU-") else f"GPU-{text}"
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        domain = getattr(props, "pci_domain_id", 0)
        dev = getattr(props, "pci_device_id", 0)
        out["pci_bus_id"] = f"{domain:08X}:{bus:02X}:{dev:02X}.0"
    return out
