"""The generation routes: ``POST /v1/generate`` (text to image) and ``POST /v1/variants``
(img2img variants of uploaded sources).

Each route first chooses its answer's media type from ``Accept``
(:data:`~genaug.service.api.negotiation.BATCH`: a 406 before anything is read or queued), then
reads its body (:mod:`~genaug.service.intake.parse`, :mod:`~genaug.service.intake.uploads`)
and plans the work (:mod:`~genaug.service.intake.plan`); from there both take one way,
:func:`serve_request`: submit to the batcher, wait (499 if the client leaves, 504 past the
deadline), encode a PNG or a safetensors batch with its metadata, and answer with the seeds
in ``X-Genaug-Seeds``.

Example::

    curl -X POST http://127.0.0.1:8000/v1/generate -H 'Accept: image/png' \\
         -d '{"prompt": "a red circle", "n": 4}' -o grid.png
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from genaug import __version__
from genaug.wire import PNG_MEDIA_TYPE, encode_batch, encode_png_grid

from ..batching.batcher import Batcher
from ..batching.items import GroupKey, Item
from ..batching.request import QueuedRequest
from ..errors import DeadlineExceededError
from ..intake.parse import read_body
from ..intake.plan import plan_items, plan_variants
from ..intake.schemas import GenerationFields
from ..intake.uploads import read_upload
from .negotiation import BATCH, Answer
from .requests import client_identity, state_of
from .responses import GENERATE_ERRORS, SAFETENSORS_LAYOUT, encoded

router = APIRouter()


@router.post(
    "/v1/generate",
    tags=["generation"],
    response_class=Response,
    responses={
        **BATCH.responses(
            "The images as a safetensors batch, or with Accept: image/png one PNG (a grid when "
            "n > 1); the seeds also in X-Genaug-Seeds. " + SAFETENSORS_LAYOUT + "Tensors: "
            "images uint8 [n, h, w, c] (c 3, RGB), seeds int64 [n] (image i's seed). "
            "Metadata: request_json (the request), resolved_json (height, width, steps, "
            "guidance, output size, scheduler and speed the defaults resolved to), model_hash, "
            "genaug_version."),
        **GENERATE_ERRORS,
    },
)
async def generate(request: Request) -> Response:
    """Generate ``n`` images; batched with other requests of the same size and steps."""
    started = time.monotonic()
    answer = BATCH.choose(request)  # a 406 before the body is read or anything queued
    state = state_of(request)
    body = await read_body(request, state.api.generate, state.api.hints["generate"])
    if state.forwarder is not None:  # the api role: a worker generates (api/forward.py)
        return await state.forwarder.forward(request)
    key, items = plan_items(body, state.defaults(), state.api.turbo)
    resolved = {
        "height": key.height,
        "width": key.width,
        "steps": key.steps,
        "guidance": items[0].guidance,
        "output_height": items[0].output_height,
        "output_width": items[0].output_width,
        "scheduler": key.scheduler,
        "speed": key.speed,
    }
    return await serve_request(request, answer, "generate", body, key, items,
                               started=started, resolved=resolved)


@router.post(
    "/v1/variants",
    tags=["generation"],
    response_class=Response,
    responses={
        **BATCH.responses(
            "The variants as a safetensors batch, or with Accept: image/png one PNG grid; the "
            "seeds also in X-Genaug-Seeds. " + SAFETENSORS_LAYOUT + "Tensors: images uint8 "
            "[n, h, w, 3] (source-major: n_per_image variants of source 0, then of source 1 "
            "...), seeds int64 [n], sources int32 [n] (the index of the source each variant "
            "came from). Metadata: request_json (the params), resolved_json, "
            "source_hashes_json (a hash of each source's pixels), model_hash, genaug_version."),
        **GENERATE_ERRORS,
    },
)
async def variants(request: Request) -> Response:
    """img2img variants of the uploaded sources (Real Guidance / DA-Fusion): ``n_per_image``
    each, ``strength`` of the schedule run from the noised source."""
    started = time.monotonic()
    answer = BATCH.choose(request)  # a 406 before the upload is read or anything queued
    state = state_of(request)
    settings = state.settings
    upload = await read_upload(
        request, state.api.variants, state.api.hints["variants"],
        max_sources=settings.max_variant_sources, max_side=settings.max_side,
    )
    if state.forwarder is not None:  # the api role: a worker generates (api/forward.py)
        return await state.forwarder.forward(request)
    key, items, sources = plan_variants(upload, state.defaults(), state.api.turbo)
    resolved = {"height": key.height, "width": key.width, "steps": key.steps,
                "strength": key.strength, "guidance": items[0].guidance,
                "scheduler": key.scheduler, "speed": key.speed}
    # Items are source-major, n_per_image each: the first of each names its source's hash.
    hashes = [item.source_hash for item in items[:: upload.params.n_per_image]]
    return await serve_request(request, answer, "variants", upload.params, key, items,
                               started=started, resolved=resolved, sources=sources,
                               source_hashes=hashes)


async def serve_request(
    request: Request,
    answer: Answer,
    route: str,
    body: GenerationFields,
    key: GroupKey,
    items: list[Item],
    *,
    started: float,
    resolved: dict[str, Any],
    sources: np.ndarray | None = None,
    source_hashes: list[str | None] | None = None,
) -> Response:
    """Submit the planned work for this client, wait for it and answer: 499 when the client
    left, else the ``answer`` negotiated before anything was queued: a PNG grid, or a
    safetensors batch whose metadata holds the request, what its defaults ``resolved`` to
    (and the ``source_hashes`` of variants), the model's hash and the version (labelled
    ``application/octet-stream`` when that was asked for); the seeds in ``X-Genaug-Seeds``.
    Records the latency under ``route``."""
    state = state_of(request)
    client = client_identity(request)
    batcher = state.require_batcher()
    timeout = body.timeout_s or state.settings.request_timeout_s
    queued = batcher.submit(key, items, client=client, priority=body.priority, timeout_s=timeout)
    images = await wait_for_images(queued, batcher, request)
    if images is None:
        return Response(status_code=499)  # client closed the connection; nobody reads this
    seeds = np.array([item.seed for item in items], dtype=np.int64)
    if answer.payload == PNG_MEDIA_TYPE:
        payload = await asyncio.to_thread(encode_png_grid, images)
    else:
        metadata: dict[str, Any] = {"request": body.model_dump(mode="json"), "resolved": resolved}
        if source_hashes is not None:
            metadata["source_hashes"] = source_hashes
        metadata["model_hash"] = state.model.weights_hash if state.model else ""
        metadata["genaug_version"] = __version__
        payload = await encoded(images, lambda: encode_batch(
            images, seeds, sources=sources, metadata=metadata))
    state.metrics.request_latency.labels(route).observe(time.monotonic() - started)
    return Response(payload, media_type=answer.media_type,
                    headers={"X-Genaug-Seeds": _seed_header(seeds), "Vary": "Accept"})


async def _until_disconnect(request: Request) -> None:
    # After the body is read, the next ASGI message is http.disconnect when the client goes.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def wait_for_images(queued: QueuedRequest, batcher: Batcher,
                          request: Request) -> np.ndarray | None:
    """The queued request's images; ``None`` if the client went away; 504 past the deadline."""
    result = asyncio.ensure_future(queued.result())
    gone = asyncio.ensure_future(_until_disconnect(request))
    try:
        timeout = max(0.0, queued.deadline - time.monotonic())
        done, _ = await asyncio.wait(
            {result, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        gone.cancel()
    if result in done:
        return result.result()
    if queued.finished and queued.cancel_reason is None:
        # The worker completed the request in the loop turn the deadline fell in: the images
        # exist, only the waiter on them had not woken yet. Answer them, not a 504.
        return await result
    result.cancel()
    if gone in done:
        batcher.forget(queued, "disconnected")
        return None
    batcher.forget(queued, "expired")
    raise DeadlineExceededError(
        f"request {queued.id} did not finish within its timeout_s; raise timeout_s, ask for "
        "fewer images, or retry when the queue is shorter"
    )


def _seed_header(seeds: np.ndarray) -> str:
    text = ",".join(str(int(s)) for s in seeds[:16])
    return text + (",..." if len(seeds) > 16 else "")
