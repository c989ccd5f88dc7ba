"""The environment of every TensorFlow child process the trainer tests start."""

from __future__ import annotations

import importlib.util
import os

import pytest


def tf_child_env() -> dict[str, str]:
    """CPU only, quiet, small thread pools (2 shared cores); skips when TF is absent.

    TensorFlow is looked up without being imported: the pytest process never loads it.
    """
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("tensorflow is not installed (pip install 'genaug[trainer]')")
    return {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "CUDA_VISIBLE_DEVICES": "",
        "KERAS_BACKEND": "tensorflow",
        "PYTHONUNBUFFERED": "1",
        "TF_NUM_INTEROP_THREADS": "2",
        "TF_NUM_INTRAOP_THREADS": "2",
    }
