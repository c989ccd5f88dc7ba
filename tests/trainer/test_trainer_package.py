"""The public surface of genaug.trainer and what importing it costs."""

from __future__ import annotations

import subprocess
import sys

import genaug.trainer

EXPECTED = [
    "FeederStats",
    "Finding",
    "PYTHON_OP_TYPES",
    "PythonInGraphError",
    "ReservoirFeeder",
    "SyntheticReservoir",
    "assert_no_python_ops",
    "python_ops_in_dataset",
    "python_ops_in_graph_def",
    "python_ops_in_model",
    "step_functions",
    "tracing_counts",
]


def test_public_names_are_pinned_and_sorted() -> None:
    assert genaug.trainer.__all__ == EXPECTED
    assert EXPECTED == sorted(EXPECTED)


def test_importing_package_and_feeder_imports_neither_tensorflow_nor_torch() -> None:
    code = (
        "import sys, genaug.trainer, genaug.trainer.feeder\n"
        "from genaug.trainer import ReservoirFeeder, FeederStats\n"
        "heavy = sorted(m for m in ('tensorflow', 'torch', 'keras') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_importing_train_and_its_modules_imports_neither_tensorflow_nor_torch() -> None:
    # Devices must be configured before TensorFlow initialises: these import it in functions.
    code = (
        "import sys\n"
        "import genaug.trainer.train, genaug.trainer.devices, genaug.trainer.instruments\n"
        "import genaug.trainer.labels\n"
        "heavy = sorted(m for m in ('tensorflow', 'torch', 'keras') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
