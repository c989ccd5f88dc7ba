"""The examples run against a live tiny service, so they cannot rot; and the errors a
notebook user meets say what to do.

The walkthrough runs in this process (it only needs the client). The trainer example runs
in a subprocess under a hard timeout: TensorFlow never loads in the pytest process.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import numpy as np
import pytest

from genaug.client import AuthenticationError, Client, TransportError
from genaug.demo import free_port

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
RECIPES = ROOT / "recipes" / "wound_phases.yaml"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"genaug_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wait_pool(url: str, per_label: int, timeout: float = 90) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        fill = httpx.get(url + "/v1/recipes").json()["recipes"][0]["fill"]
        if all(v >= per_label for v in fill.values()):
            return dict(fill)
        assert time.monotonic() < deadline, f"pool did not fill: {fill}"
        time.sleep(0.2)


def test_notebook_walkthrough_runs(
    make_service: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    live = make_service(recipes=RECIPES, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=2, max_batch_images=8)
    walkthrough = load_example("notebook_walkthrough")
    out = walkthrough.main(live.url, tmp_path / "out")

    info = httpx.get(live.url + "/v1/info").json()
    assert out["info"]["model"]["hash"] == info["model"]["hash"]
    assert out["grid"].read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert out["images"].shape == (4, 64, 64, 3) and out["images"].dtype == np.uint8
    sample = out["sample"]
    assert sample is not None and len(sample) > 0 and sample.label_names == ["I", "P", "R"]
    assert len(out["saved"]) == len(sample)
    for path in out["saved"]:
        assert path.is_file() and path.parent.name in {"I", "P", "R"}
    clients = {c["client"]: c for c in httpx.get(live.url + "/v1/clients").json()["clients"]}
    assert clients["notebook-walkthrough"]["requests"] == 2
    printed = capsys.readouterr().out
    assert info["model"]["hash"] in printed and "wound-phases" in printed


def test_notebook_walkthrough_without_recipes(service: Any, tmp_path: Path) -> None:
    out = load_example("notebook_walkthrough").main(service.url, tmp_path)
    assert out["sample"] is None and out["saved"] == [] and (tmp_path / "grid.png").is_file()


def test_trainer_example_trains_with_the_service(make_service: Any, tmp_path: Path) -> None:
    if importlib.util.find_spec("tensorflow") is None:  # find_spec does not import it
        pytest.skip("tensorflow is not installed (pip install 'genaug[trainer]')")
    live = make_service(recipes=RECIPES, pool_path=tmp_path / "pool.db",
                        pool_capacity_per_label=8, max_batch_images=8)
    wait_pool(live.url, 8)
    env = {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "CUDA_VISIBLE_DEVICES": "",
        "KERAS_BACKEND": "tensorflow",
        "TF_NUM_INTEROP_THREADS": "2",
        "TF_NUM_INTRAOP_THREADS": "2",
    }
    env.pop("GENAUG_URL", None)
    cmd = [sys.executable, str(EXAMPLES / "trainer_example.py"), live.url, "--epochs", "3",
           "--steps", "3"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env,
                              cwd=tmp_path)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"trainer example did not finish within 240 s\n{exc.stderr!r}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    match = re.search(r"feeder: (\d+) images in (\d+) requests, reservoir fill (\[[^\]]*\])",
                      proc.stdout)
    assert match, proc.stdout[-3000:]
    assert int(match.group(1)) > 0, proc.stdout[-3000:]
    assert "tensorflow" not in sys.modules


# -- what a notebook user is told --------------------------------------------------------------


def test_closed_port_says_how_to_start_the_service() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with Client(url, retry_deadline=0.3) as client, pytest.raises(TransportError) as caught:
        client.info()
    message = str(caught.value)
    assert url in message and "genaug serve" in message and "GENAUG_URL" in message

    with Client(url) as client, pytest.raises(TransportError) as caught:
        client.wait_ready(timeout=0.5)
    assert "genaug serve" in str(caught.value)

    walkthrough = load_example("notebook_walkthrough")
    with pytest.raises(TransportError, match="genaug serve"):
        walkthrough.connect(url, timeout=0.5)


def test_missing_or_wrong_key_names_the_setting(
    make_service: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GENAUG_API_KEY", raising=False)
    live = make_service(api_keys=["notebook-key"])
    with Client(live.url) as client, pytest.raises(AuthenticationError) as caught:
        client.info()
    message = str(caught.value)
    assert caught.value.status == 401
    assert "GENAUG_API_KEY" in message and "api_key=" in message

    with Client(live.url, api_key="wrong") as client, pytest.raises(AuthenticationError) as caught:
        client.info()
    assert "GENAUG_API_KEY" in str(caught.value) and "api_key=" in str(caught.value)

    with Client(live.url, api_key="notebook-key") as client:
        assert client.info()["auth"] is True
