"""Wire codecs shared by the service and the clients (``genaug.wire``, owned by both sides).

It lives at the package root, below both: the service and ``genaug.client`` import it from
here, and it needs only numpy and safetensors (``pip install genaug[client]``).

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
images of 64x64, ten times this). Reading a batch makes one writable copy of the payload and
views the tensors in it (``safetensors.numpy.load`` copies every tensor on top of that), after
checking every offset as the ``safetensors`` library does: known dtype, sizes that match the
shapes, tensors back to back from the start of the data to its end. The tests
check that the library reads what this module writes, and that both readers agree.

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
#: What an ``X-Client-Id`` may be (the service refuses any other with a 422; the clients check
#: their ``client_id`` against it when they are made, so a bad one fails at once, not as
#: every request's 422 inside a feeder thread).
CLIENT_ID_PATTERN = r"^[A-Za-z0-9._:@/-]{1,64}$"
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
        tensors, header = _views(payload)
    except ValueError as exc:  # json.JSONDecodeError is one
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


_WIRE_DTYPES: dict[str, np.dtype[Any]] = {
    "U8": np.dtype("<u1"), "I32": np.dtype("<i4"), "I64": np.dtype("<i8"),
}


def _views(payload: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The tensors of a safetensors ``payload`` as views into one writable copy of it (callers
    may scale images in place), and its string metadata; ``ValueError`` naming the first
    thing that is not as safetensors requires."""
    if len(payload) < 8:
        raise ValueError("payload shorter than a safetensors header")
    n = int.from_bytes(payload[:8], "little")
    if n > len(payload) - 8:
        raise ValueError("header length exceeds payload")
    try:
        header = json.loads(payload[8 : 8 + n])
    except RecursionError:
        raise ValueError("the header's JSON is nested too deeply") from None
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise ValueError("__metadata__ is not an object")
    start, size = 8 + n, len(payload) - 8 - n
    entries: list[tuple[int, int, str, np.dtype[Any], list[int], int]] = []
    for name, info in header.items():
        try:
            dtype, shape = _WIRE_DTYPES[info["dtype"]], info["shape"]
            begin, end = info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"tensor {name!r} is not a U8, I32 or I64 tensor with shape and data_offsets: "
                f"{str(info)[:120]}"
            ) from None
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)
                and type(begin) is int and type(end) is int):
            raise ValueError(f"tensor {name!r} has a malformed shape or offsets: {info}")
        count = math.prod(shape)
        if end - begin != count * dtype.itemsize:
            raise ValueError(f"tensor {name!r}: offsets {begin}..{end} do not hold shape {shape}")
        entries.append((begin, end, name, dtype, shape, count))
    position = 0
    tensors: dict[str, np.ndarray] = {}
    data = bytearray(memoryview(payload)[start:])
    for begin, end, name, dtype, shape, count in sorted(entries, key=lambda e: (e[0], e[1])):
        if begin != position:  # a gap or an overlap
            raise ValueError(f"tensor {name!r} starts at {begin}, expected {position}")
        position = end
        array = np.frombuffer(data, dtype, count, begin)
        tensors[name] = array.reshape(shape)
    if position != size:
        raise ValueError(f"the tensors cover {position} of the {size} data bytes")
    return tensors, {str(k): str(v) for k, v in meta.items()}


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
