"""``genaug demo``: the whole round trip on the embedded default, no GPU, no download.

Starts ``genaug serve`` (the ``tiny-digits`` generator) as a child process on 127.0.0.1,
waits for readiness, asks the client for a row of images per digit and writes them as one
labelled grid PNG, then (unless ``--no-train``) trains a small CNN on 5 real digits per class
in a separate TensorFlow process, with and without pool images mixed in through the
reservoir, prints both test accuracies, and stops everything; the orchestration is
:func:`genaug.trainer.demo.run_full_demo`. With ``--no-train`` it waits for the recipe pool
to fill instead.
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
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def running_service(
    port: int, *, extra_args: Sequence[str] = (), env: dict[str, str] | None = None,
    log_path: Path | None = None, entry: Sequence[str] = ("-m", "genaug.service"),
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``python -m genaug.service`` as a child process; SIGTERM and wait on exit.

    ``entry`` replaces ``-m genaug.service`` (a script that takes the same ``--port``).
    """
    cmd = [sys.executable, *entry, "--port", str(port), *extra_args]
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


def run_demo(*, out: str = "genaug-demo.png", port: int = 0, train: bool = True) -> int:
    """The README's main job: service, a labelled grid through the client, then (with
    ``train``) few-shot training with and without genaug mixing under MirroredStrategy."""
    from genaug.trainer.demo import run_full_demo

    code: int = run_full_demo(port=port, grid_out=Path(out), train=train)
    return code
