"""``genaug demo``: the whole round trip on the embedded tiny model, no GPU, no download.

Starts ``genaug serve`` as a child process on 127.0.0.1, waits for readiness, asks the
client for a few images per label, writes them as one labelled grid PNG, and stops the
service cleanly. With ``train=True`` it goes on to the full loop (pool filling and a short
training run mixing synthetic images through the reservoir); see :mod:`genaug.trainer.demo`.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

DEMO_LABELS = {
    "I": "depth image of a diabetic foot ulcer, inflammatory phase, red swollen wound bed",
    "P": "depth image of a diabetic foot ulcer, proliferative phase, granulation tissue",
    "R": "depth image of a diabetic foot ulcer, remodelling phase, closing scar",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def running_service(
    port: int, *, extra_args: Sequence[str] = (), env: dict[str, str] | None = None,
    log_path: Path | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``python -m genaug.service`` as a child process; SIGTERM and wait on exit."""
    cmd = [sys.executable, "-m", "genaug.service", "--port", str(port), *extra_args]
    out = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env or os.environ.copy())
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if log_path:
            out.close()  # type: ignore[union-attr]


def labelled_grid(rows: dict[str, np.ndarray], *, scale: int = 2) -> bytes:
    """A PNG with one row per label: the label's name, then its images."""
    from PIL import Image, ImageDraw

    first = next(iter(rows.values()))
    h, w = first.shape[1] * scale, first.shape[2] * scale
    cols = max(len(images) for images in rows.values())
    margin = 48
    canvas = Image.new("RGB", (margin + cols * (w + 4), len(rows) * (h + 4)), "white")
    draw = ImageDraw.Draw(canvas)
    for r, (label, images) in enumerate(rows.items()):
        y = r * (h + 4)
        draw.text((8, y + h // 2 - 6), label, fill="black")
        for c, image in enumerate(images):
            tile = Image.fromarray(image).resize((w, h), Image.Resampling.NEAREST)
            canvas.paste(tile, (margin + c * (w + 4), y))
    buf = io.BytesIO()
    canvas.save(buf, format="PNG")
    return buf.getvalue()


def run_demo(*, out: str = "genaug-demo.png", port: int = 0, per_label: int = 6) -> int:
    """Start, generate a labelled grid through the client, stop. Returns an exit code."""
    from genaug.client import Client, GenaugError

    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    print(f"starting the genaug service (tiny offline SDXL pipeline, CPU) at {url} ...")
    started = time.monotonic()
    with running_service(port) as proc, Client(url, client_id="demo") as client:
        try:
            client.wait_ready(timeout=180)
        except GenaugError as exc:
            print(f"the service did not become ready: {exc}", file=sys.stderr)
            return 1
        info = client.info()
        model = info["model"]
        print(f"ready in {time.monotonic() - started:.1f} s: {model['kind']} model, "
              f"weights {model['weights_hash']}, {info['device']}/{info['dtype']}")
        rows: dict[str, np.ndarray] = {}
        for i, (label, prompt) in enumerate(DEMO_LABELS.items()):
            t0 = time.monotonic()
            result = client.generate(prompt, n=per_label, seed=1000 * i)
            rows[label] = result.images
            print(f"  {label}: {len(result)} images {result.images.shape[1:]} seeds "
                  f"{result.seeds[0]}..{result.seeds[-1]} in {time.monotonic() - t0:.2f} s")
        Path(out).write_bytes(labelled_grid(rows))
        print(f"wrote {out} ({len(rows)} labels x {per_label} images)")
    code = proc.returncode
    print(f"service stopped (exit code {code})")
    return 0 if code == 0 else 1
