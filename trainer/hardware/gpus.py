"""Which local GPU the genaug service runs on, and the order CUDA lists them in: pure
functions of an NVML table (:class:`~genaug.trainer.hardware.nvml.GpuInfo`), the service's
``/v1/info`` answer and an environment, so they are unit-tested without a GPU.

The CUDA UUID is unique across machines, so it decides wherever it is known; the PCI bus id
only identifies a GPU within one machine. ``CUDA_VISIBLE_DEVICES`` may list UUIDs or indices,
and indices count in CUDA's order, which :func:`cuda_order` works out when it can.

Example::

    found = match_service_gpu(table, service_device(client.info(), url))
    cuda_order(table, {"CUDA_VISIBLE_DEVICES": "1,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .nvml import GpuInfo

__all__ = [
    "ServiceDevice",
    "cuda_order",
    "match_service_gpu",
    "normalize_pci_bus_id",
    "normalize_uuid",
    "service_device",
]

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0", "[::1]"}


@dataclass(frozen=True)
class ServiceDevice:
    """Where the service's pipeline runs, from ``/v1/info`` ``device``."""

    type: str
    name: str = ""
    cuda_uuid: str | None = None
    pci_bus_id: str | None = None
    local: bool = True

    @property
    def on_cuda(self) -> bool:
        return self.type == "cuda"


def normalize_uuid(uuid: str | None) -> str | None:
    """``GPU-3b1f...`` / ``3B1F...`` -> ``3b1f...`` (lower case, no ``GPU-``/``MIG-`` prefix)."""
    if not uuid:
        return None
    text = str(uuid).strip().lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    return text or None


def normalize_pci_bus_id(bus_id: str | None) -> str | None:
    """``00000000:3B:00.0`` (NVML) / ``0000:3b:00.0`` / ``3b:00.0`` -> ``0000:3b:00.0``."""
    if not bus_id:
        return None
    text = str(bus_id).strip().lower()
    parts = text.split(":")
    try:
        if len(parts) == 2:
            domain, bus, rest = 0, parts[0], parts[1]
        elif len(parts) == 3:
            domain, bus, rest = int(parts[0], 16), parts[1], parts[2]
        else:
            return text
        device, _, function = rest.partition(".")
        return f"{domain:04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function or '0', 16)}"
    except ValueError:
        return text


def match_service_gpu(table: Sequence[GpuInfo], device: ServiceDevice) -> GpuInfo | None:
    """The local GPU the service runs on, or ``None`` (CPU service, another host, not listed).

    The CUDA UUID is unique across machines, so it decides wherever it is known. The PCI bus
    id only identifies a GPU within one machine: it is used when the service reports no UUID
    and its URL is on this host.
    """
    if not device.on_cuda:
        return None
    uuid = normalize_uuid(device.cuda_uuid)
    if uuid is not None:
        return next((g for g in table if normalize_uuid(g.uuid) == uuid), None)
    pci = normalize_pci_bus_id(device.pci_bus_id)
    if pci is not None and device.local:
        return next((g for g in table if normalize_pci_bus_id(g.pci_bus_id) == pci), None)
    return None


def cuda_order(
    table: Sequence[GpuInfo], environ: Mapping[str, str] | None = None
) -> list[GpuInfo] | None:
    """The GPUs a CUDA process (TensorFlow) enumerates, in its order; ``None`` if unknown.

    ``CUDA_VISIBLE_DEVICES`` may list UUIDs (any unique prefix, ``GPU-`` optional), which
    fixes the order, or indices, which count in CUDA's order: PCI bus order when
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or when all GPUs are one model (CUDA's default
    "fastest first" order cannot differ then), else unknown. Unset: every GPU. An invalid
    entry ends the list there, as in CUDA.
    """
    env = os.environ if environ is None else environ
    by_pci = sorted(table, key=lambda g: normalize_pci_bus_id(g.pci_bus_id) or "")
    pci_order_known = env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID" or len(
        {g.name for g in table}
    ) <= 1
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return by_pci if pci_order_known else None
    out: list[GpuInfo] = []
    for entry in (e.strip() for e in raw.split(",")):
        if not entry:
            break
        if entry.lstrip("-").isdigit():
            if not pci_order_known:
                return None
            k = int(entry)
            if not 0 <= k < len(by_pci) or by_pci[k] in out:
                break
            out.append(by_pci[k])
        else:
            want = normalize_uuid(entry) or ""
            found = [g for g in table if (normalize_uuid(g.uuid) or "").startswith(want)]
            if len(found) != 1 or found[0] in out:
                break
            out.append(found[0])
    return out


def _is_local(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    if host in LOCAL_HOSTS or host.startswith("127."):
        return True
    import socket

    try:
        names = {socket.gethostname().lower(), socket.getfqdn().lower()}
        return host in names
    except OSError:
        return False


def service_device(info: Mapping[str, Any], url: str = "") -> ServiceDevice:
    """The service's device from a ``/v1/info`` answer (the ``device`` group, or the plain
    device string older services send)."""
    raw = info.get("device")
    local = _is_local(url) if url else True
    if isinstance(raw, Mapping):
        name = str(raw.get("name") or "")
        kind = str(raw.get("type") or name.split(":")[0] or "cpu")
        return ServiceDevice(
            type=kind, name=name, cuda_uuid=raw.get("cuda_uuid"),
            pci_bus_id=raw.get("pci_bus_id"), local=local,
        )
    name = str(raw or "cpu")
    return ServiceDevice(type=name.split(":")[0], name=name, local=local)
