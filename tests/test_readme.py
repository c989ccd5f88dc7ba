"""The README's code blocks run as written against a default ``genaug serve``.

The service is the real thing, started as a user would (``genaug serve --recipes
recipes/wound_phases.yaml``, the embedded default model, default settings) with only its port
and pool file chosen by the test. The blocks are taken from README.md as they are; the only
substitutions are the ones listed here, so a block that stops working fails this test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from genaug.local_service import free_port

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
URL_IN_README = "http://127.0.0.1:8000"

# Blocks that need a trainer's own objects (a dataset, a model, TensorFlow devices): their
# client calls run below (the fill/feedback lines); the rest is the trainer tests' subject.
NEEDS_A_TRAINER = ("from genaug.trainer import", "from genaug.trainer.need import")


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("readme")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENAUG_")}
    env["GENAUG_POOL_PATH"] = str(work / "pool.db")
    log = (work / "serve.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "genaug.cli", "serve", "--recipes",
         str(ROOT / "recipes" / "wound_phases.yaml"), "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, (work / "serve.log").read_text()
            assert time.monotonic() < deadline, "genaug serve did not get ready"
            try:
                if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def run(code: str, url: str, **names: Any) -> dict[str, Any]:
    namespace: dict[str, Any] = dict(names)
    exec(compile(code.replace(URL_IN_README, url), "README.md", "exec"), namespace)
    return namespace


def test_every_python_block_is_run_or_listed() -> None:
    blocks = python_blocks()
    assert len(blocks) >= 4
    for block in blocks:
        runs = "from genaug.client import Client" in block or "client.variants(" in block
        assert runs or any(marker in block for marker in NEEDS_A_TRAINER), block


def test_the_client_block(url: str) -> None:
    block = next(b for b in python_blocks() if "from genaug.client import Client" in b)
    names = run(block, url)
    assert names["batch"].images.shape[0] == 8 and names["png"].startswith(b"\x89PNG")
    assert names["pool"].label_names == ["I", "P", "R"]


def test_the_variants_block(url: str) -> None:
    from genaug.client import Client

    block = next(b for b in python_blocks() if "client.variants(real_images" in b)
    with Client(url) as client:
        real_images = np.zeros((2, 64, 64, 3), np.uint8)  # stands for the user's own images
        names = run(block, url, client=client, real_images=real_images)
    assert len(names["out"].images) == 8 and list(names["out"].sources) == [0] * 4 + [1] * 4


def test_the_feedback_and_fill_lines(url: str) -> None:
    # The need block's client calls, as written; on a default (pre-generating) service too
    from genaug.client import Client

    block = next(b for b in python_blocks() if "client.fill(" in b)
    lines = "\n".join(line for line in block.splitlines() if line.startswith("client."))
    assert "client.feedback(" in lines and "client.fill(" in lines, lines
    with Client(url) as client:
        run(lines, url, client=client)
        detail = client.recipe("wound-phases")
    assert detail["need"]["P"] > detail["need"]["I"] > 0, detail["need"]
    assert any(v["asked"] > 0 for v in detail["per_label"].values()), detail["per_label"]
