"""genaug: out-of-process generative augmentation for deep-learning training.

The distribution has three parts, each in its own subpackage and its own process:

- ``genaug.service``: the FastAPI service that owns one diffusers SDXL pipeline.
- ``genaug.client``: small async and sync httpx clients (``pip install genaug[client]``).
- ``genaug.trainer``: the TensorFlow reservoir, feeder and graph audit.

``genaug.wire`` (the safetensors batch format) is shared by the service and the client, and
``genaug.local_service`` starts a service as a child process (demo, benchmarks, tests).

Importing this package imports none of torch, tensorflow or httpx.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
