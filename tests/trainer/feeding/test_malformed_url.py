"""A feeder given a malformed URL is refused where it is made, in one line, at once: not
after its client's retries in the feeder thread (30 s, then "no answer from the service"),
and not only as a logged error when it is lenient. The refusal is the client's
(:func:`genaug.urls.url_refusal`), said by the feeder's constructor since its client is built
later, in the thread. TensorFlow runs in a child (``_url_child.py``), as every trainer test's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _tf_env import tf_child_env

HERE = Path(__file__).resolve().parent
MARK = "GENAUG_RESULT "
FIX = "write http://HOST:PORT, e.g. http://127.0.0.1:8000"


@pytest.fixture(scope="module")
def refused() -> dict[str, Any]:
    env = {k: v for k, v in tf_child_env().items() if k != "GENAUG_URL"}
    proc = subprocess.run([sys.executable, str(HERE / "_url_child.py")], capture_output=True,
                          text=True, timeout=180, env=env, cwd=HERE)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        pytest.fail(f"_url_child.py failed (exit {proc.returncode})\n{proc.stdout[-2000:]}\n"
                    f"{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len(MARK):])
    return result


@pytest.mark.parametrize(("case", "message"), [
    ("url", f"ReservoirFeeder url 'notaurl' is not a service URL (no http:// or https://); "
            f"{FIX}"),
    ("lenient", f"ReservoirFeeder url 'notaurl' is not a service URL (no http:// or "
                f"https://); {FIX}"),
    ("replicas", f"ReservoirFeeder url[1] 'ftp://gen-host' is not a service URL (scheme "
                 f"'ftp'); {FIX}"),
    ("env", f"ReservoirFeeder: GENAUG_URL entry 'gen-host:8000' is not a service URL (scheme "
            f"'gen-host'); {FIX}, or pass url=..."),
])
def test_a_feeder_with_a_malformed_url_is_refused_at_once(refused: dict[str, Any], case: str,
                                                          message: str) -> None:
    got = refused[case]
    assert got["raised"] == "ValueError", got
    assert got["message"] == message
    assert got["seconds"] < 1.0, got
