"""Which devices a trainer trains on, and keeping them apart from the generator's GPU.

:func:`configure_devices` makes exactly the requested devices visible and returns their names
for ``MirroredStrategy``. With ``service_url`` it first asks the genaug service which GPU it
runs on (``/v1/info`` ``device.cuda_uuid`` / ``device.pci_bus_id``), finds that GPU among the
local ones through NVML (``nvidia-ml-py``), and hides it from TensorFlow (through
``CUDA_VISIBLE_DEVICES``, by UUID, so the order CUDA enumerates devices in cannot matter).
TensorFlow then cannot take the generator's memory; memory growth is on for the GPUs it keeps.

All of it must happen before TensorFlow initialises its GPUs: the function refuses, with an
error saying so, once it has. That is why this module imports TensorFlow only inside
functions, and why the reference trainer calls it first.

Example::

    from genaug.trainer import configure_devices

    devices = configure_devices(service_url="http://127.0.0.1:8000")  # all GPUs but the service's
    strategy = tf.distribute.MirroredStrategy(devices)

    configure_devices(cpu_replicas=4)   # ['/cpu:0', '/cpu:1', '/cpu:2', '/cpu:3'] (tests, CPUs)

The matching itself (:mod:`~genaug.trainer.hardware.gpus`, and :func:`visible_after_hiding`
here) is pure and takes the NVML table as data, so it is unit-tested without a GPU; the table
comes from :mod:`~genaug.trainer.hardware.nvml`. This module's ``__all__`` re-exports the
names it has always exported, so their callers keep one import.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from .gpus import (
    ServiceDevice,
    cuda_order,
    match_service_gpu,
    normalize_pci_bus_id,
    normalize_uuid,
    service_device,
)
from .nvml import GpuInfo
from .nvml import gpus as nvml_gpus

__all__ = [
    "DeviceError",
    "GpuInfo",
    "ServiceDevice",
    "configure_devices",
    "cuda_order",
    "match_service_gpu",
    "normalize_pci_bus_id",
    "normalize_uuid",
    "nvml_gpus",
    "service_device",
    "tensorflow_sees_service_gpu",
    "visible_after_hiding",
]

log = logging.getLogger(__name__)


class DeviceError(RuntimeError):
    """The devices asked for cannot be used (missing GPU index, TensorFlow already started,
    the generator's GPU cannot be told apart)."""


def visible_after_hiding(
    table: Sequence[GpuInfo], hide: GpuInfo, environ: Mapping[str, str] | None = None
) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value that shows this process what it sees now, less
    ``hide``: a comma-separated UUID list (``""`` when nothing is left).

    Raises:
        DeviceError: the current ``CUDA_VISIBLE_DEVICES`` uses indices whose order cannot be
            known (mixed GPU models without ``CUDA_DEVICE_ORDER=PCI_BUS_ID``).
    """
    order = cuda_order(table, environ)
    if order is None:
        raise DeviceError(
            "CUDA_VISIBLE_DEVICES lists GPU indices, and with GPUs of different models their "
            "order is CUDA's 'fastest first', which NVML cannot tell; set "
            "CUDA_DEVICE_ORDER=PCI_BUS_ID or list GPU UUIDs (nvidia-smi -L)"
        )
    return ",".join(g.uuid for g in order if g.uuid != hide.uuid)


def _fetch_service_device(url: str) -> ServiceDevice:
    from genaug.client import Client, GenaugError

    try:
        with Client(url, retry_deadline=10.0, timeout=10.0) as client:
            info = client.info()
    except GenaugError as exc:
        raise DeviceError(
            f"cannot ask the genaug service at {url} which GPU it uses ({exc}); start it "
            "first, or leave out service_url= and pass gpus= yourself"
        ) from exc
    return service_device(info, url)


def _tf_gpus_initialized() -> bool:
    """TensorFlow has enumerated its GPUs in this process (hiding by environment is too late)."""
    if "tensorflow" not in sys.modules:
        return False
    try:
        from tensorflow.python.eager import context
    except ImportError:
        return False
    ctx = context.context()
    return (getattr(ctx, "_physical_devices", None) is not None
            or getattr(ctx, "_context_handle", None) is not None)


def _hide_service_gpu(url: str, *, explicit_gpus: bool) -> str:
    """Hide the service's GPU through CUDA_VISIBLE_DEVICES; return what was done, in words."""
    try:
        device = _fetch_service_device(url)
    except DeviceError:
        table = nvml_gpus()
        if not table:  # no GPU here: nothing TensorFlow could take from the generator
            return f"the genaug service at {url} did not answer; this machine has no GPU to hide"
        if explicit_gpus:
            log.warning("the genaug service at %s did not answer; trusting gpus= to leave its "
                        "GPU out", url)
            return f"the genaug service at {url} did not answer; nothing hidden"
        raise
    if not device.on_cuda:
        return f"the genaug service at {url} runs on {device.name or device.type}: no GPU to hide"
    if device.cuda_uuid is None and device.pci_bus_id is None:
        message = (
            f"the genaug service at {url} runs on {device.name} but does not report its GPU's "
            "identity (cuda_uuid/pci_bus_id in /v1/info; an older genaug?)"
        )
        if explicit_gpus:
            log.warning("%s; trusting gpus= to leave it out", message)
            return message + "; nothing hidden"
        raise DeviceError(message + "; upgrade the service or pass gpus= without its GPU")
    table = nvml_gpus()
    if table is None:
        if not device.local:
            return f"the genaug service at {url} runs on another host: no local GPU hidden"
        message = (
            f"the genaug service at {url} runs on {device.name} (UUID {device.cuda_uuid}) but "
            "NVML is not available here to find that GPU (pip install nvidia-ml-py; NVIDIA "
            "driver)"
        )
        if explicit_gpus:
            log.warning("%s; trusting gpus= to leave it out", message)
            return message + "; nothing hidden"
        raise DeviceError(message + "; or pass gpus= without the service's GPU")
    found = match_service_gpu(table, device)
    if found is None:
        return (
            f"the genaug service at {url} runs on GPU {device.cuda_uuid or device.pci_bus_id}, "
            f"which is not one of this machine's {len(table)} GPU(s) (it is on another host): "
            "no local GPU hidden"
        )
    visible = visible_after_hiding(table, found)
    os.environ["CUDA_VISIBLE_DEVICES"] = visible
    return (
        f"hid GPU {found.index} ({found.name}, {found.uuid}, PCI {found.pci_bus_id}) from "
        f"TensorFlow: the genaug service at {url} runs on it; CUDA_VISIBLE_DEVICES={visible!r}"
    )


def configure_devices(
    gpus: Sequence[int] | None = None,
    cpu_replicas: int | None = None,
    service_url: str | None = None,
) -> list[str]:
    """Make exactly the requested devices visible; return the names for ``MirroredStrategy``.

    Must run before TensorFlow initialises its GPUs (before any op or ``tf.config`` query
    that lists devices).

    * ``service_url``: first ask that genaug service for its GPU's identity and hide that
      GPU from TensorFlow (NVML maps it to a local GPU). A service on the CPU, or on another
      host, hides nothing (logged). Without ``gpus`` every remaining GPU is used.
    * ``gpus``: indices into ``tf.config.list_physical_devices("GPU")`` as they are *after*
      the service's GPU is hidden (without ``service_url``: list the service's GPU nowhere).
    * neither: the CPU, and GPUs TensorFlow would otherwise grab are hidden.
    * ``cpu_replicas``: on the CPU, split it into that many logical devices.

    Memory growth is turned on for every GPU kept, so TensorFlow takes memory as it needs it.

    Raises:
        DeviceError: a GPU index that does not exist, ``cpu_replicas < 1``, GPUs and CPU
            replicas both asked for, the service's GPU cannot be told apart, or TensorFlow
            already initialised.
    """
    if gpus and cpu_replicas:
        raise DeviceError("pass --gpus or --cpu-replicas, not both")
    if service_url is not None:
        if _tf_gpus_initialized():
            raise DeviceError(
                "configure_devices(service_url=...) was called after TensorFlow initialised "
                "its GPUs, so the generator's GPU can no longer be hidden from it; call it "
                "first thing, before any tf.config call, tf.distribute strategy or op"
            )
        decision = _hide_service_gpu(service_url, explicit_gpus=bool(gpus))
        log.info("genaug devices: %s", decision)

    import tensorflow as tf

    try:
        physical_gpus = tf.config.list_physical_devices("GPU")
        use_all = service_url is not None and gpus is None and not cpu_replicas
        if use_all and physical_gpus:
            gpus = list(range(len(physical_gpus)))
        if gpus:
            if not physical_gpus:
                raise DeviceError(
                    f"--gpus {','.join(map(str, gpus))} asked for GPUs but TensorFlow sees none "
                    "(CUDA build? CUDA_VISIBLE_DEVICES?); leave out --gpus to train on the CPU"
                )
            bad = [g for g in gpus if not 0 <= g < len(physical_gpus)]
            if bad or len(set(gpus)) != len(gpus):
                raise DeviceError(
                    f"--gpus {','.join(map(str, gpus))}: TensorFlow sees {len(physical_gpus)} "
                    f"GPU(s), indices 0..{len(physical_gpus) - 1}; invalid or repeated: "
                    f"{bad or gpus}"
                )
            chosen = [physical_gpus[g] for g in gpus]
            tf.config.set_visible_devices(chosen, "GPU")
            for device in chosen:
                tf.config.experimental.set_memory_growth(device, True)
            return [f"/gpu:{i}" for i in range(len(chosen))]
        if physical_gpus:
            log.warning(
                "TensorFlow sees %d GPU(s) but --gpus was not given: training on the CPU and "
                "leaving every GPU alone (the service may own one)", len(physical_gpus)
            )
            tf.config.set_visible_devices([], "GPU")
        if cpu_replicas is not None:
            if cpu_replicas < 1:
                raise DeviceError(f"--cpu-replicas {cpu_replicas} must be >= 1")
            cpu = tf.config.list_physical_devices("CPU")[0]
            try:
                tf.config.set_logical_device_configuration(
                    cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(cpu_replicas)]
                )
            except RuntimeError:
                # Already initialised: fine if it was with exactly this split (a second run
                # in one process, a notebook re-running a cell).
                if len(tf.config.list_logical_devices("CPU")) != cpu_replicas:
                    raise
            return [f"/cpu:{i}" for i in range(cpu_replicas)]
        return ["/cpu:0"]
    except RuntimeError as exc:
        if isinstance(exc, DeviceError):
            raise
        raise DeviceError(
            f"cannot configure devices ({exc}): TensorFlow was already initialised in this "
            "process. --gpus / --cpu-replicas must be applied before any TensorFlow op runs; "
            "start training in a fresh process"
        ) from exc


def tensorflow_sees_service_gpu(
    info: Mapping[str, Any], url: str = "", *, table: Sequence[GpuInfo] | None = None,
    environ: Mapping[str, str] | None = None, visible_indices: Sequence[int] | None = None,
) -> str | None:
    """A warning when TensorFlow in this process can use the generator's GPU, else ``None``.

    Only looks when TensorFlow is already imported (the feeder never imports it). Which TF
    GPUs are visible comes from ``tf.config.get_visible_devices`` unless ``visible_indices``
    is given; ``table`` / ``environ`` replace NVML and ``os.environ`` (tests).
    """
    device = service_device(info, url)
    if not device.on_cuda or (device.cuda_uuid is None and device.pci_bus_id is None):
        return None
    if table is None:
        table = nvml_gpus()
        if table is None:
            return None
    found = match_service_gpu(table, device)
    if found is None:
        return None
    order = cuda_order(table, environ)
    if visible_indices is None:
        if "tensorflow" not in sys.modules:
            return None
        import tensorflow as tf

        visible_indices = [
            int(d.name.rsplit(":", 1)[-1]) for d in tf.config.get_visible_devices("GPU")
        ]
    if order is None:
        if not visible_indices:
            return None
        return (
            f"TensorFlow sees {len(visible_indices)} GPU(s) and the genaug service at {url} "
            f"runs on GPU {found.index} of this machine; which TensorFlow GPU that is cannot "
            "be told (mixed GPU models): call configure_devices(service_url=...) first"
        )
    if any(0 <= i < len(order) and order[i].uuid == found.uuid for i in visible_indices):
        return (
            f"TensorFlow can use GPU {found.index} ({found.name}, {found.uuid}), where the "
            f"genaug service at {url} runs its generator: TensorFlow will take most of its "
            "memory and the service will run out. Call "
            f"genaug.trainer.configure_devices(service_url={url!r}) before anything else "
            "touches TensorFlow"
        )
    return None
