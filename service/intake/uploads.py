"""Reading the ``multipart/form-data`` upload of ``POST /v1/variants``.

Parts: one ``image`` part per source (a PNG), or one ``images`` part holding a genaug
safetensors batch (``images`` uint8 ``[N, H, W, 3]``), plus one ``params`` part (JSON,
validated by the app's :class:`~genaug.service.intake.schemas.VariantParams` with the JSON
bodies' parser, :func:`~genaug.service.intake.parse.parse_json`). Every problem is a 422
that names the part, what was found and what to send; the body size was already bounded by
the guard (``GENAUG_MAX_UPLOAD_BYTES``) before any of this runs.

Example::

    curl -F image=@three.png -F 'params={"prompt": "a handwritten three"}' \\
         -H 'Accept: image/png' http://127.0.0.1:8000/v1/variants -o variants.png
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import Request
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException

from genaug.wire import WireError, decode_image_upload

from ..errors import InvalidRequestError
from .parse import parse_json
from .schemas import VariantParams

PARTS = ("image", "images", "params")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass
class Upload:
    """The sources (uint8 ``[H, W, 3]`` each, one size) and the validated params."""

    sources: list[np.ndarray]
    params: VariantParams

    @property
    def size(self) -> tuple[int, int]:
        height, width = self.sources[0].shape[:2]
        return int(height), int(width)


async def read_upload(
    request: Request,
    model: type[VariantParams],
    hints: Mapping[str, str],
    *,
    max_sources: int,
    max_side: int,
) -> Upload:
    """Parse and check the upload; raises :class:`InvalidRequestError` naming the part."""
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        raise InvalidRequestError(
            f"Content-Type {content_type[:80]!r} is not multipart/form-data; send the sources "
            "as 'image' parts (PNG) or one 'images' part (a genaug safetensors batch), plus a "
            "'params' JSON part (curl -F image=@a.png -F 'params={\"prompt\": \"...\"}')",
            field="body",
        )
    try:
        form = await request.form(max_files=max_sources + 2, max_fields=len(PARTS) + 2)
    except (MultiPartException, ValueError) as exc:  # python-multipart's errors are ValueErrors
        raise InvalidRequestError(
            f"the multipart body could not be read ({type(exc).__name__}: {str(exc)[:160]}); "
            f"send at most {max_sources} image parts and one params part",
            field="body",
        ) from None
    try:
        unknown = sorted(set(form.keys()) - set(PARTS))
        if unknown:
            raise InvalidRequestError(
                f"unknown part {unknown[0]!r}; the parts are 'image' (one PNG per source) or "
                "'images' (one safetensors batch), and 'params' (JSON)",
                field=unknown[0],
            )
        params = await _params(form.getlist("params"), model, hints)
        sources = await _sources(form.getlist("image"), form.getlist("images"), max_sources)
    finally:
        await form.close()
    _check_sizes(sources, max_side)
    return Upload(sources=sources, params=params)


async def _bytes(part: Any) -> bytes:
    if isinstance(part, UploadFile):
        return await part.read()
    return str(part).encode("utf-8")


async def _params(
    parts: list[Any], model: type[VariantParams], hints: Mapping[str, str]
) -> VariantParams:
    if len(parts) != 1:
        raise InvalidRequestError(
            f"{len(parts)} 'params' parts; send exactly one, a JSON object such as "
            "{\"prompt\": \"a handwritten three\", \"strength\": 0.5}",
            field="params",
        )
    return parse_json(model, await _bytes(parts[0]), hints, part="params")


async def _sources(pngs: list[Any], batches: list[Any], max_sources: int) -> list[np.ndarray]:
    if pngs and batches:
        raise InvalidRequestError(
            "both 'image' and 'images' parts were sent; send PNGs as 'image' parts or one "
            "safetensors batch as the 'images' part, not both",
            field="images",
        )
    if len(batches) > 1:
        raise InvalidRequestError(
            f"{len(batches)} 'images' parts; send one safetensors batch holding every source",
            field="images",
        )
    if batches:
        payload = await _bytes(batches[0])
        kind = _picture_kind(payload)
        if kind is not None:  # a picture in the batch's part: the safetensors reader would
            # read its first bytes as a header length ("header too large") and never say why
            name = getattr(batches[0], "filename", None) or "the upload"
            fix = ("send PNG files as 'image' parts (curl -F image=@file.png)" if kind == "PNG"
                   else "send images as PNG files in 'image' parts (convert the JPEG first)")
            raise InvalidRequestError(
                f"images part {name!r} is a {kind} file; the 'images' part takes one genaug "
                f"safetensors batch; {fix}",
                field="images",
            )
        try:
            stacked = await asyncio.to_thread(decode_image_upload, payload)
        except WireError as exc:
            raise InvalidRequestError(f"images part: {exc}", field="images") from None
        sources = [np.ascontiguousarray(image) for image in stacked]
    else:
        sources = [await _png(part, i) for i, part in enumerate(pngs)]
    if not sources:
        raise InvalidRequestError(
            "no source image; send 'image' parts (PNG) or one 'images' part", field="image"
        )
    if len(sources) > max_sources:
        raise InvalidRequestError(
            f"{len(sources)} sources exceed max_variant_sources {max_sources}; send fewer per "
            "request or set GENAUG_MAX_VARIANT_SOURCES",
            field="images" if batches else "image",
        )
    return sources


def _picture_kind(data: bytes) -> str | None:
    """``"PNG"`` or ``"JPEG"`` when ``data`` starts like one, else None."""
    if data.startswith(_PNG_SIGNATURE):
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    return None


async def _png(part: Any, index: int) -> np.ndarray:
    data = await _bytes(part)
    name = getattr(part, "filename", None) or f"#{index}"
    if not data.startswith(_PNG_SIGNATURE):
        raise InvalidRequestError(
            f"image part {name!r} ({len(data)} bytes) is not a PNG; send PNG images (or a "
            "safetensors batch as the 'images' part)",
            field="image",
        )
    try:
        return await asyncio.to_thread(_decode_png, data)
    except Exception as exc:  # Pillow raises many types for broken files
        raise InvalidRequestError(
            f"image part {name!r} could not be decoded as a PNG ({type(exc).__name__}: "
            f"{str(exc)[:120]}); send a valid PNG",
            field="image",
        ) from None


def _decode_png(data: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
        if width * height > 8192 * 8192:  # refuse decompression bombs before decoding
            raise ValueError(f"{width}x{height} is too large to decode")
        rgb = image.convert("RGB")
        return np.asarray(rgb, dtype=np.uint8).copy()


def _check_sizes(sources: list[np.ndarray], max_side: int) -> None:
    height, width = sources[0].shape[:2]
    for i, source in enumerate(sources):
        if source.shape[:2] != (height, width):
            raise InvalidRequestError(
                f"source {i} is {source.shape[1]}x{source.shape[0]} but source 0 is "
                f"{width}x{height}; the sources of one request share one size (send "
                "different sizes in separate requests)",
                field="image",
            )
    if height % 8 or width % 8 or min(height, width) < 8:
        raise InvalidRequestError(
            f"sources are {width}x{height}; the generation size is the sources' size and must "
            "be a multiple of 8 on each side: crop or resize them (e.g. to 64x64)",
            field="image",
        )
    if max(height, width) > max_side:
        raise InvalidRequestError(
            f"sources are {width}x{height}, over max_side {max_side}; send smaller images or "
            "set GENAUG_MAX_SIDE",
            field="image",
        )
