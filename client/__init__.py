"""genaug client: talk to a genaug service from a trainer, a script or a notebook.

Installs with ``pip install genaug[client]`` (httpx, numpy, pydantic, safetensors; no torch,
no tensorflow).

Example::

    from genaug.client import Client

    with Client("http://127.0.0.1:8000") as client:
        client.wait_ready()
        batch = client.generate("depth image of a healing wound", n=8, seed=0)
        batch.images  # uint8 [8, H, W, 3]
        variants = client.variants(batch.images[:2], "a healing wound", strength=0.5,
                                   n_per_image=3, seed=0)
        variants.sources  # [0, 0, 0, 1, 1, 1]: which input each variant came from
        job = client.fill("digits", per_label=200)   # a FillJob: the service's job
        job.wait(timeout=600)["state"]               # "done" (or stopped, failed, cancelled)

``backoff_s`` is the clients' one backoff formula, public for loops that retry on their own
(the trainer's feeder). The wire codecs live in :mod:`genaug.wire`, shared with the service.
"""

from __future__ import annotations

from ._async import AsyncClient, AsyncFillJob
from ._results import GenerateResult, SampleResult
from ._retry import backoff_s
from ._sync import Client, FillJob
from .errors import (
    AuthenticationError,
    ConflictError,
    DeadlineExceededError,
    DecodeError,
    GenaugError,
    InvalidRequestError,
    NotFoundError,
    RateLimitedError,
    ServerError,
    StatusError,
    TransportError,
    UnavailableError,
)

__all__ = [
    "AsyncClient",
    "AsyncFillJob",
    "AuthenticationError",
    "Client",
    "ConflictError",
    "DeadlineExceededError",
    "DecodeError",
    "FillJob",
    "GenaugError",
    "GenerateResult",
    "InvalidRequestError",
    "NotFoundError",
    "RateLimitedError",
    "SampleResult",
    "ServerError",
    "StatusError",
    "TransportError",
    "UnavailableError",
    "backoff_s",
]
