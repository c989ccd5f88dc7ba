"""Wire codecs shared by the service and the clients.

Batches travel as safetensors: a JSON header, then raw little-endian tensors. Safe to parse
(no pickle), zero-copy to decode, no base64. Tensors: ``images`` uint8 ``[N, H, W, C]`` with
``C`` 3 (RGB) or 1 (one channel, for recipes with ``output_channels: 1``), ``seeds`` int64
``[N]``, ``labels`` int32 ``[N]`` where images belong to labels, and ``sources`` int32 ``[N]``
for img2img variants (which input image each output came from, source-major order). String
metadata sits in the header; values that are not strings are JSON-encoded under keys ending
in ``_json``.

Writing: :func:`encode_batch` writes the safetensors format itself (an 8-byte length, the JSON
header padded to 8 bytes, the tensors in order of decreasing alignment, one copy of the
pixels), because ``safetensors.numpy.save`` copies a batch several times (about 1 ms for 64
images of 64x64, ten times this). Reading always goes through the ``safetensors`` library,
which validates every offset; the tests check that it reads what this module writes.

Example::

    payload = encode_batch(images, seeds, metadata={"model_hash": "ab12"})
    batch = decode_batch(payload)
    batch.images.shape, batch.metadata["model_hash"]
"""

from __future__ import annotations

import io
import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load

SAFETENSORS_MEDIA_TYPE = "application/vnd.genaug.safetensors"
PNG_MEDIA_TYPE = "image/png"
CHANNELS = (1, 3)
"""Channel counts a batch may carry: RGB, or one channel (luminance, depth)."""


class WireError(ValueError):
    """A payload that is not a genaug batch."""


@dataclass
class Batch:
    """A decoded batch: ``images`` uint8 NHWC (C 1 or 3), ``seeds`` int64, optional
    ``labels`` int32 and ``sources`` int32."""

    images: np.ndarray
    seeds: np.ndarray
    labels: np.ndarray | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    sources: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.images.shape[0])


def encode_batch(
    images: np.ndarray,
    seeds: np.ndarray,
    *,
    labels: np.ndarray | None = None,
    metadata: dict[str, Any] | None = None,
    sources: np.ndarray | None = None,
) -> bytes:
    """Serialize a batch. ``images`` must be uint8 ``[N, H, W, C]`` with ``C`` in {1, 3}."""
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in CHANNELS:
        raise WireError(
            f"images must be uint8 [N,H,W,C] with C in {{1, 3}}, got {images.dtype} "
            f"{images.shape}"
        )
    tensors = {
        "images": np.ascontiguousarray(images),
        "seeds": np.ascontiguousarray(seeds, dtype=np.int64),
    }
    if labels is not None:
        tensors["labels"] = np.ascontiguousarray(labels, dtype=np.int32)
    if sources is not None:
        tensors["sources"] = np.ascontiguousarray(sources, dtype=np.int32)
    _check_lengths(tensors)
    header: dict[str, str] = {}
    for key, value in (metadata or {}).items():
        # A string under a key that ends in _json would be read back as JSON: encode it too.
        if isinstance(value, str) and not key.endswith("_json"):
            header[key] = value
        else:
            header[f"{key}_json"] = json.dumps(value, separators=(",", ":"))
    return serialize(tensors, metadata=header)


_DTYPES = {np.dtype(np.uint8): "U8", np.dtype(np.int32): "I32", np.dtype(np.int64): "I64"}


def serialize(tensors: dict[str, np.ndarray], *, metadata: dict[str, str]) -> bytes:
    """The safetensors file of ``tensors`` (uint8, int32 or int64; C-contiguous) with string
    ``metadata``, built with one copy of the data.

    Tensors go in order of decreasing item size, so each starts at an offset that is a
    multiple of its item size (the data section starts 8-byte aligned): a reader can view
    them without copying.
    """
    order = sorted(tensors, key=lambda name: (-tensors[name].dtype.itemsize, name))
    entries: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name in order:
        array = tensors[name]
        size = array.nbytes
        entries[name] = {"dtype": _DTYPES[array.dtype], "shape": list(array.shape),
                         "data_offsets": [offset, offset + size]}
        offset += size
    header = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    header += b" " * (-(8 + len(header)) % 8)
    chunks: list[bytes | memoryview] = [struct.pack("<Q", len(header)), header]
    for name in order:
        array = np.ascontiguousarray(tensors[name])
        if array.size:  # memoryview cannot cast an empty view, and there is nothing to copy
            chunks.append(array.reshape(-1).data.cast("B"))
    return b"".join(chunks)


def decode_batch(payload: bytes) -> Batch:
    """Parse a batch produced by :func:`encode_batch`; raises :class:`WireError` otherwise."""
    try:
        tensors = load(payload)
        header = _read_metadata(payload)
    except (SafetensorError, ValueError, json.JSONDecodeError) as exc:
        raise WireError(f"not a safetensors batch: {exc}") from exc
    if "images" not in tensors or "seeds" not in tensors:
        raise WireError(f"batch lacks images/seeds tensors: {sorted(tensors)}")
    expected = {
        "images": (np.uint8, 4), "seeds": (np.int64, 1), "labels": (np.int32, 1),
        "sources": (np.int32, 1),
    }
    for name, (dtype, ndim) in expected.items():
        tensor = tensors.get(name)
        if tensor is not None and (tensor.dtype != dtype or tensor.ndim != ndim):
            raise WireError(
                f"batch tensor {name} is {tensor.dtype} {tensor.shape}, expected "
                f"{np.dtype(dtype)} with {ndim} dimensions"
            )
    if tensors["images"].shape[-1] not in CHANNELS:
        raise WireError(
            f"batch images are {tensors['images'].shape}, expected [N, H, W, C] with C in {{1, 3}}"
        )
    _check_lengths(tensors)
    metadata: dict[str, Any] = {}
    for key, value in header.items():
        if key.endswith("_json"):
            try:
                metadata[key[: -len("_json")]] = json.loads(value)
            except json.JSONDecodeError as exc:
                raise WireError(f"batch metadata {key!r} is not JSON: {exc}") from exc
        else:
            metadata[key] = value
    return Batch(
        images=tensors["images"],
        seeds=tensors["seeds"],
        labels=tensors.get("labels"),
        metadata=metadata,
        sources=tensors.get("sources"),
    )


def encode_image_upload(images: np.ndarray) -> bytes:
    """The ``images`` part of an upload (``POST /v1/variants``): a safetensors file holding
    one ``images`` tensor, uint8 ``[N, H, W, 3]``."""
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise WireError(f"images must be uint8 [N,H,W,3], got {images.dtype} {images.shape}")
    return serialize({"images": np.ascontiguousarray(images)}, metadata={})


def decode_image_upload(payload: bytes) -> np.ndarray:
    """The images of an upload part written by :func:`encode_image_upload` (or by
    :func:`encode_batch`: other tensors are ignored). Raises :class:`WireError` naming what
    is wrong, for a 422 that names the part."""
    try:
        tensors = load(payload)
    except (SafetensorError, ValueError) as exc:
        raise WireError(f"the images part is not a safetensors file: {exc}") from exc
    images = tensors.get("images")
    if images is None:
        raise WireError(f"the images part holds no 'images' tensor (found {sorted(tensors)})")
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise WireError(
            f"the images part holds {images.dtype} {images.shape}; expected uint8 [N, H, W, 3]"
        )
    if images.shape[0] == 0:
        raise WireError("the images part holds no image (N = 0)")
    return images


def _check_lengths(tensors: dict[str, np.ndarray]) -> None:
    n = tensors["images"].shape[0]
    for name in ("seeds", "labels", "sources"):
        if name in tensors and tensors[name].shape != (n,):
            raise WireError(
                f"{name} has shape {tensors[name].shape}; a batch of {n} images needs ({n},)"
            )


def _read_metadata(payload: bytes) -> dict[str, str]:
    if len(payload) < 8:
        raise ValueError("payload shorter than a safetensors header")
    n = int.from_bytes(payload[:8], "little")
    if n > len(payload) - 8:
        raise ValueError("header length exceeds payload")
    header = json.loads(payload[8 : 8 + n])
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict):
        raise ValueError("__metadata__ is not an object")
    return {str(k): str(v) for k, v in meta.items()}


def encode_png_grid(images: np.ndarray, *, columns: int | None = None) -> bytes:
    """One PNG: the image itself when N == 1, else a grid (needs Pillow, a service dependency).

    One-channel images give a greyscale PNG."""
    from PIL import Image

    n, h, w, c = images.shape
    cols = columns or math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    grid = np.zeros((rows * h, cols * w, c), dtype=np.uint8)
    for i in range(n):
        r, col = divmod(i, cols)
        grid[r * h : (r + 1) * h, col * w : (col + 1) * w] = images[i]
    buf = io.BytesIO()
    Image.fromarray(grid[..., 0] if c == 1 else grid).save(buf, format="PNG")
    return buf.getvalue()
