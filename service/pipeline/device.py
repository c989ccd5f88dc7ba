"""Facts about the torch device the pipeline runs on, and its CPU thread count.

Imported by the lifespan when the model loads (never by the routes: it imports torch).

Example::

    threads = configure_threads(settings.torch_threads, torch.device("cpu"))
    identity(torch.device("cuda:0"))   # {"name": "cuda:0", "type": "cuda",
                                       #  "cuda_uuid": "GPU-...", "pci_bus_id": "00000000:65:00.0"}
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

log = logging.getLogger(__name__)


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
