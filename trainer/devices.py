"""Device selection for the reference trainer: which GPUs (or CPU replicas) it trains on.

:func:`configure_devices` makes exactly the requested devices visible and returns their names
for ``MirroredStrategy``: the GPUs given by index as TensorFlow lists them (leave out the
service's), or the CPU, split into ``cpu_replicas`` logical devices if asked. Devices can only
be configured before TensorFlow initialises its runtime, which is why the trainer calls this
first and why this module, like :mod:`genaug.trainer.train`, imports TensorFlow only inside
functions.

Example::

    devices = configure_devices(cpu_replicas=4)   # ['/cpu:0', '/cpu:1', '/cpu:2', '/cpu:3']
    strategy = tf.distribute.MirroredStrategy(devices)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

__all__ = ["DeviceError", "configure_devices"]

log = logging.getLogger(__name__)


class DeviceError(RuntimeError):
    """The devices asked for cannot be used (missing GPU index, TensorFlow already started)."""



def configure_devices(
    gpus: Sequence[int] | None = None, cpu_replicas: int | None = None
) -> list[str]:
    """Make exactly the requested devices visible; return the names for ``MirroredStrategy``.

    Must run before TensorFlow initialises its runtime (before any op or ``tf.config`` query
    that creates devices). ``gpus`` are indices into ``tf.config.list_physical_devices("GPU")``
    (list the service's GPU nowhere); without them the CPU is used, and GPUs TensorFlow would
    otherwise grab are hidden. ``cpu_replicas`` splits the CPU into that many logical devices.

    Raises:
        DeviceError: a GPU index that does not exist, ``cpu_replicas < 1``, both options, or
            TensorFlow already initialised.
    """
    import tensorflow as tf

    if gpus and cpu_replicas:
        raise DeviceError("pass --gpus or --cpu-replicas, not both")
    physical_gpus = tf.config.list_physical_devices("GPU")
    try:
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
