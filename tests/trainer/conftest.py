"""Fixtures for tests/trainer.

TensorFlow never runs in the pytest process: logical CPU devices must be configured before
TensorFlow initializes, and the service tests import torch in this process. ``run_tf_child``
runs a named scenario of ``_tf_child.py`` in a fresh interpreter under a hard timeout and
returns the JSON it prints.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _tf_env import tf_child_env

HERE = Path(__file__).resolve().parent
CHILD = HERE / "_tf_child.py"
MARK = "GENAUG_RESULT "

TfChild = Callable[[str, float], dict[str, Any]]


def _run_tf_child(scenario: str, timeout: float) -> dict[str, Any]:
    env = tf_child_env()
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, str(CHILD), scenario],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=HERE,
        )
    except subprocess.TimeoutExpired as e:
        tail = (e.stderr or b"")[-4000:]
        pytest.fail(
            f"scenario {scenario!r} did not finish within {timeout:.0f} s (hung?)\n{tail!r}"
        )
    wall = time.monotonic() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        pytest.fail(
            f"scenario {scenario!r} failed (exit {proc.returncode})\n"
            f"--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1][len(MARK) :])
    result["wall_s"] = round(wall, 2)
    return result


@pytest.fixture(scope="session")
def run_tf_child() -> TfChild:
    """Run ``_tf_child.py SCENARIO`` with 4 logical CPU devices; return its JSON result."""
    return _run_tf_child
