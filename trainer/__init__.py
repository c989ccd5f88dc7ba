"""genaug.trainer: feed generated images into TensorFlow training without Python in the graph.

- :class:`SyntheticReservoir`: a class-indexed host tensor of synthetic images and a
  ``tf.data`` map function that mixes them in with pure graph ops.
- :class:`ReservoirFeeder`: a daemon thread that keeps the reservoir fresh from the service.
- :class:`NeedCallback`: a Keras callback that measures per-class need on held-out real
  images and reports it to the service, whose pre-generation then fills those labels faster.
- :func:`assert_no_python_ops` and friends: walk the op types of a dataset and of a model's
  step functions and fail on ops that call back into Python.
- :func:`configure_devices`: the devices to train on, with the generator's GPU hidden from
  TensorFlow (call it first, before TensorFlow initialises its GPUs).
- :func:`diagnose` and :func:`diagnose_callback`: run a few steps of the real pipeline and
  model (or the first epoch of ``fit``) and report, with one fix line each, Python ops in the
  graph, retracing, input-bound steps, NaN/Inf, empty classes, out-of-memory risk, XLA
  failures and a GPU shared with the generator.

Example::

    from genaug.trainer import (ReservoirFeeder, SyntheticReservoir, assert_no_python_ops,
                                configure_devices)

    devices = configure_devices(service_url="http://127.0.0.1:8000")  # first: hides its GPU
    strategy = tf.distribute.MirroredStrategy(devices)                # before the reservoir
    reservoir = SyntheticReservoir(num_classes=3, slots_per_class=256, image_shape=(64, 64, 3))
    feeder = ReservoirFeeder(reservoir, url="http://127.0.0.1:8000", recipe="demo",
                             label_map={"cat": 0, "dog": 1, "fox": 2})
    ds = real_ds.batch(64, drop_remainder=True).map(reservoir.mix(p=0.5)).prefetch(2)
    with strategy.scope():
        model = build_model()
        model.compile(...)
    assert_no_python_ops(dataset=ds, model=model)
    model.fit(ds, epochs=3, callbacks=[feeder.callback()])  # strict: config errors raise here

The package is in layers, one package each, by what a user is doing:

- ``mixing/``: the reservoir and the graph ops that mix it into a ``tf.data`` pipeline.
- ``feeding/``: the feeder thread that fills the reservoir from the service, its preflight
  (the first-contact checks), label matching, and the need reported back.
- ``hardware/``: one NVML session, the devices to train on, and the training host's facts.
- ``checks/``: the graph audit, the step instruments, and ``diagnose`` with its findings.
- ``reference/``: ``genaug train``'s library (config, data, the trainer, its summary).

The demo's and the benchmarks' experiments live in ``genaug.experiments``.

Names are imported lazily: ``genaug.trainer.feeding`` (the feeder, on :mod:`genaug.feeding`),
``genaug.trainer.hardware`` and ``genaug.trainer.checks.diagnose`` do not import TensorFlow at
import time; the reservoir, the audit and ``NeedCallback`` do.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .checks.audit import (
        PYTHON_OP_TYPES,
        Finding,
        PythonInGraphError,
        assert_no_python_ops,
        python_ops_in_dataset,
        python_ops_in_graph_def,
        python_ops_in_model,
        step_functions,
        tracing_counts,
    )
    from .checks.diagnose import diagnose, diagnose_callback
    from .feeding.feeder import FeederConfigError, FeederStats, ReservoirFeeder
    from .feeding.need import NeedCallback
    from .hardware.devices import DeviceError, configure_devices
    from .mixing.reservoir import SyntheticReservoir

__all__ = [
    "DeviceError",
    "FeederConfigError",
    "FeederStats",
    "Finding",
    "NeedCallback",
    "PYTHON_OP_TYPES",
    "PythonInGraphError",
    "ReservoirFeeder",
    "SyntheticReservoir",
    "assert_no_python_ops",
    "configure_devices",
    "diagnose",
    "diagnose_callback",
    "python_ops_in_dataset",
    "python_ops_in_graph_def",
    "python_ops_in_model",
    "step_functions",
    "tracing_counts",
]

_WHERE = {
    "PYTHON_OP_TYPES": "checks.audit",
    "DeviceError": "hardware.devices",
    "FeederConfigError": "feeding.feeder",
    "configure_devices": "hardware.devices",
    "diagnose": "checks.diagnose",
    "diagnose_callback": "checks.diagnose",
    "FeederStats": "feeding.feeder",
    "Finding": "checks.audit",
    "NeedCallback": "feeding.need",
    "PythonInGraphError": "checks.audit",
    "ReservoirFeeder": "feeding.feeder",
    "SyntheticReservoir": "mixing.reservoir",
    "assert_no_python_ops": "checks.audit",
    "python_ops_in_dataset": "checks.audit",
    "python_ops_in_graph_def": "checks.audit",
    "python_ops_in_model": "checks.audit",
    "step_functions": "checks.audit",
    "tracing_counts": "checks.audit",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'genaug.trainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
