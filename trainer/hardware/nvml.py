"""The one place genaug's trainer side opens NVML, and what it reads through it.

:func:`session` initialises NVML (``nvidia-ml-py``) and shuts it down again, yielding the
``pynvml`` module, or ``None`` without NVML (the package is not installed, no NVIDIA driver):
every reader below then answers ``None`` and the caller says what it could not tell. NVML is
never left open between calls, so nothing here holds the driver while TensorFlow starts.

Example::

    gpus()                   # [GpuInfo(index=0, uuid='GPU-3b1f...', ...)] or None
    with session() as nvml:  # several reads in one session
        if nvml is not None:
            nvml.nvmlDeviceGetCount()
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["GpuInfo", "driver", "gpus", "memory_total", "session"]


@dataclass(frozen=True)
class GpuInfo:
    """One local GPU as NVML lists it (NVML index order is PCI bus order)."""

    index: int
    uuid: str
    pci_bus_id: str
    name: str = ""


@contextmanager
def session() -> Iterator[Any]:
    """NVML, initialised for the block and shut down after it; ``None`` without NVML."""
    try:
        import pynvml
    except ImportError:
        yield None
        return
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded...
        yield None
        return
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpus() -> list[GpuInfo] | None:
    """The local GPUs as NVML lists them, or ``None`` without NVML (no driver, no
    ``nvidia-ml-py``: ``pip install 'genaug[trainer]'``)."""
    with session() as nvml:
        if nvml is None:
            return None
        out = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            out.append(GpuInfo(
                index=i,
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(handle).busId),
                name=_text(nvml.nvmlDeviceGetName(handle)),
            ))
        return out


def driver() -> tuple[str | None, int | None]:
    """(the NVIDIA driver's version, the newest CUDA it supports as ``12040``); ``None``s
    without NVML."""
    with session() as nvml:
        if nvml is None:
            return None, None
        try:
            raw = nvml.nvmlSystemGetDriverVersion()
            cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
        except Exception:
            return None, None
        return _text(raw), cuda


def memory_total(uuid: str) -> int | None:
    """The memory of the GPU with this UUID, in bytes; ``None`` when NVML cannot tell."""
    with session() as nvml:
        if nvml is None:
            return None
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            return int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
        except Exception:
            return None
