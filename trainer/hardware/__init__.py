"""Hardware: what this machine has, read without importing TensorFlow.

- ``nvml.py``: the one place NVML is opened (:func:`~genaug.trainer.hardware.nvml.session`),
  and what is read through it: the GPU table, the driver, a GPU's memory.
- ``gpus.py``: pure matching of the service's GPU against the local table and
  ``CUDA_VISIBLE_DEVICES`` (unit-tested with tables as data).
- ``devices.py``: :func:`~genaug.trainer.hardware.devices.configure_devices`, the devices to
  train on with the generator's GPU hidden from TensorFlow.
- ``host.py``: the training host's facts and ``genaug doctor``'s verdicts on them;
  ``versions.py``, its versions check (TensorFlow and Keras, or torch, against the driver).
"""
