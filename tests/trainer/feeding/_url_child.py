"""TensorFlow side of tests/trainer/feeding/test_malformed_url.py, in its own interpreter.

Usage: ``python tests/trainer/feeding/_url_child.py``: builds a :class:`SyntheticReservoir`
(TensorFlow) and a :class:`ReservoirFeeder` for it with a malformed ``url``, a malformed
``GENAUG_URL`` in its place, and a replica list holding one; records how each was refused and
how long it took. The last stdout line is ``GENAUG_RESULT {json}``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import tensorflow as tf

from genaug.trainer import ReservoirFeeder, SyntheticReservoir

tf.get_logger().setLevel("ERROR")


def attempt(**kwargs: Any) -> dict[str, Any]:
    """Make a feeder (and start it, should it be made); what was raised, how fast."""
    reservoir = SyntheticReservoir(2, 4, (8, 8, 3))
    started = time.monotonic()
    try:
        feeder = ReservoirFeeder(reservoir, recipe="shapes", label_map={"circle": 0},
                                 first_contact_timeout_s=30, **kwargs)
        try:
            feeder.start()
        finally:
            feeder.stop()
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": str(exc),
                "seconds": time.monotonic() - started}
    return {"raised": None, "message": "", "seconds": time.monotonic() - started}


results = {
    "url": attempt(url="notaurl"),
    "lenient": attempt(url="notaurl", strict=False),
    "replicas": attempt(url=["http://127.0.0.1:9", "ftp://gen-host"]),
}
os.environ["GENAUG_URL"] = "gen-host:8000"
results["env"] = attempt()
print("GENAUG_RESULT " + json.dumps(results), flush=True)
