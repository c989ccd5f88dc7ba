"""What a call answers: the result types and the decoders that build them from a body.

``generate`` and ``variants`` answer a :class:`GenerateResult`, ``sample`` a
:class:`SampleResult`, both decoded from the genaug safetensors batch (:mod:`genaug.wire`);
``generate_png`` answers the PNG's bytes, checked to be one. A body that is not what genaug
sends is :class:`~genaug.client.DecodeError`.

Example::

    result = decode_generate(response.content)   # what Client.generate returns
    result.images.shape                          # (n, h, w, 3), uint8
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from genaug.wire import WireError, decode_batch

from .errors import DecodeError


@dataclass
class GenerateResult:
    """Images from ``generate`` or ``variants``: ``images`` uint8 ``[n, h, w, 3]``, ``seeds``
    int64 ``[n]``.

    ``sources`` int32 ``[n]``: for ``variants``, which input image each output came from
    (source-major: all variants of image 0, then of image 1...); ``None`` for text-to-image.
    ``metadata`` holds the request as the service understood it (``request``,
    ``resolved``) and the model's ``model_hash``.
    """

    images: np.ndarray
    seeds: np.ndarray
    metadata: dict[str, Any] = field(default_factory=dict)
    sources: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.images.shape[0])


@dataclass
class SampleResult:
    """Images from a recipe's pool: ``labels`` int32 indices into ``label_names``.

    ``source_hashes``: for pools with img2img labels, the hash of the real image each image
    is a variant of (``None`` for a text-to-image one, the hash ``/v1/variants`` answers);
    ``None`` when no image of the sample is a variant. ``empty_labels``: labels asked for
    that the sample holds no image of (their pool is still filling; ``[]`` from a service
    that does not say). ``stopped``: labels asked for that the service's judge stopped (it
    accepted too few of their images, so no more are made and ``wait_s`` does not wait for
    them), each with the judge's reason and fix (``{}`` from a service that does not say).
    A loop that waits for a label to fill ends when it appears here.

    Example::

        result = client.sample("digits", labels=["3", "8"], n=64, wait_s=30.0)
        for label, why in result.stopped.items():
            print(label, why)   # "stopped: the judge accepted 2 of the 50 images ... Fix: ..."
    """

    images: np.ndarray
    labels: np.ndarray
    seeds: np.ndarray
    label_names: list[str]
    recipe: str
    metadata: dict[str, Any] = field(default_factory=dict)
    source_hashes: list[str | None] | None = None
    empty_labels: list[str] = field(default_factory=list)
    stopped: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.images.shape[0])


def decode_generate(payload: bytes) -> GenerateResult:
    try:
        batch = decode_batch(payload)
    except WireError as exc:
        raise DecodeError(f"the service sent a body that is not a genaug batch: {exc}") from exc
    return GenerateResult(
        images=batch.images, seeds=batch.seeds, metadata=batch.metadata, sources=batch.sources
    )


def decode_sample(payload: bytes, recipe: str) -> SampleResult:
    try:
        batch = decode_batch(payload)
    except WireError as exc:
        raise DecodeError(f"the service sent a body that is not a genaug batch: {exc}") from exc
    names = batch.metadata.get("label_names", [])
    labels = batch.labels if batch.labels is not None else np.zeros(len(batch), np.int32)
    hashes = batch.metadata.get("source_hashes")
    if hashes is not None and (not isinstance(hashes, list) or len(hashes) != len(batch)):
        raise DecodeError(
            f"the service sent source_hashes for {len(hashes) if isinstance(hashes, list) else 0}"
            f" images with a sample of {len(batch)}"
        )
    return SampleResult(
        images=batch.images, labels=labels, seeds=batch.seeds, label_names=list(names),
        recipe=recipe, metadata=batch.metadata, source_hashes=hashes,
        empty_labels=[str(x) for x in batch.metadata.get("empty_labels") or []],
        stopped={str(k): str(v) for k, v in (batch.metadata.get("stopped") or {}).items()},
    )


def expect_png(payload: bytes) -> bytes:
    if not payload.startswith(b"\x89PNG\r\n\x1a\n"):
        raise DecodeError("asked for a PNG but the body is not one")
    return payload
