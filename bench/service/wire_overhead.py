"""Bytes on the wire per image vs. raw H x W x 3, for n in {1, 8, 64} and sizes 64 and 256.

Two measurements per cell:

- ``encode_batch``: the codec alone (random images, real metadata shape): body bytes, the
  safetensors header (8-byte length + JSON, metadata included) and the per-image overhead.
- ``service``: one real ``POST /v1/generate`` per cell against a child-process service
  (64x64 generation, 1 step; 256 via ``output_height``/``output_width``), counting the
  response body and the HTTP status line and headers.

Goal: body <= 1.01 x raw + fixed header (the header does not grow with n beyond a few bytes of
JSON per tensor shape digit). Per image the payload adds only the int64 seed.

    python -m bench.service.wire_overhead [--quick]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench.harness import finish, goal_text, main, parse_args, table
from bench.services import service

GOAL = 1.01


def header_bytes(payload: bytes) -> int:
    return 8 + int.from_bytes(payload[:8], "little")


def http_head_bytes(response: Any) -> int:
    """Status line + header lines + blank line, as sent (HTTP/1.1)."""
    head = len(f"HTTP/1.1 {response.status_code} {response.reason_phrase}\r\n")
    head += sum(len(k) + len(v) + 4 for k, v in response.headers.raw)
    return head + 2


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(__doc__ or "", argv)
    import httpx
    import numpy as np

    from genaug.wire import SAFETENSORS_MEDIA_TYPE, decode_batch, encode_batch

    counts = (1, 8) if args.quick else (1, 8, 64)
    sizes = (64, 256)
    rng = np.random.default_rng(0)
    rows = []
    cells: list[dict[str, Any]] = []
    with (
        service(
            threads=args.threads, max_batch_images=64, max_wait_ms=0, max_queue_images=4096
        ) as url,
        httpx.Client(timeout=120) as http,
    ):
        for size in sizes:
            for n in counts:
                raw = n * size * size * 3
                images = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
                seeds = rng.integers(0, 2**62, n)
                meta = {
                    "request": {"prompt": "depth image of a wound", "n": n},
                    "model_hash": "0" * 16,
                    "genaug_version": "0.0.0",
                }
                local = encode_batch(images, seeds, metadata=meta)
                response = http.post(
                    url + "/v1/generate",
                    json={
                        "prompt": "depth image of a wound",
                        "n": n,
                        "seed": 1,
                        "steps": 1,
                        "height": 64,
                        "width": 64,
                        "output_height": size,
                        "output_width": size,
                    },
                    headers={"Accept": SAFETENSORS_MEDIA_TYPE},
                )
                response.raise_for_status()
                body = response.content
                assert decode_batch(body).images.shape == (n, size, size, 3)
                head = header_bytes(body)
                http_head = http_head_bytes(response)
                ratio = (len(body) - head) / raw
                cell = {
                    "size": size,
                    "n": n,
                    "raw": raw,
                    "encode_bytes": len(local),
                    "encode_header": header_bytes(local),
                    "service_body": len(body),
                    "service_header": head,
                    "http_head": http_head,
                    "ratio_excl_header": ratio,
                    "ratio_incl_headers": (len(body) + http_head) / raw,
                }
                cells.append(cell)
                rows.append(
                    [
                        f"{size}x{size}",
                        n,
                        raw,
                        len(local),
                        header_bytes(local),
                        len(body),
                        head,
                        http_head,
                        f"{(len(body) - head - raw) / n:.0f}",
                        f"{ratio:.5f}",
                        f"{cell['ratio_incl_headers']:.4f}",
                    ]
                )
    worst = max(c["ratio_excl_header"] for c in cells)
    table(
        "Wire overhead (safetensors body; raw = n x H x W x 3)",
        [
            "size",
            "n",
            "raw bytes",
            "encode_batch bytes",
            "its header",
            "service body",
            "its header",
            "HTTP head",
            "bytes/image beyond raw",
            "(body - header) / raw",
            "(body + HTTP head) / raw",
        ],
        rows,
    )
    print(f"goal (body - header) / raw <= {GOAL}: worst {worst:.5f}, {goal_text(worst <= GOAL)}")
    return finish(
        {
            "benchmark": "wire_overhead",
            "cells": cells,
            "worst_ratio": worst,
            "goal": GOAL,
            "met": worst <= GOAL,
        },
        args.json,
    )


if __name__ == "__main__":
    main(run)
