"""The public surface of genaug.trainer and what importing it costs."""

from __future__ import annotations

import subprocess
import sys

import genaug.trainer

EXPECTED = [
    "DeviceError",
    "FeederConfigError",
    "FeederStats",
    "Finding",
    "NeedCallback",
    "PYTHON_OP_TYPES",
    "PythonInGraphError",
    "ReservoirFeeder",
    "SyntheticReservoir",
    "assert_no_python_ops",
    "configure_devices",
    "diagnose",
    "diagnose_callback",
    "python_ops_in_dataset",
    "python_ops_in_graph_def",
    "python_ops_in_model",
    "step_functions",
    "tracing_counts",
]


def test_public_names_are_pinned_and_sorted() -> None:
    assert genaug.trainer.__all__ == EXPECTED
    assert EXPECTED == sorted(EXPECTED)


def assert_imports_neither_tensorflow_nor_torch(imports: str) -> None:
    """Run ``imports`` in a fresh interpreter and fail if TensorFlow, torch or Keras is loaded."""
    check = ("heavy = sorted(m for m in ('tensorflow', 'torch', 'keras') if m in sys.modules)\n"
             "assert not heavy, heavy\n")
    proc = subprocess.run([sys.executable, "-c", "import sys\n" + imports + check],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_importing_package_and_feeder_imports_neither_tensorflow_nor_torch() -> None:
    assert_imports_neither_tensorflow_nor_torch(
        "import genaug.trainer, genaug.trainer.feeding.feeder\n"
        "from genaug.trainer import ReservoirFeeder, FeederStats, configure_devices\n"
        "from genaug.trainer import DeviceError, FeederConfigError\n"
    )


def test_importing_train_and_its_modules_imports_neither_tensorflow_nor_torch() -> None:
    # Devices must be configured before TensorFlow initialises: these import it in functions.
    assert_imports_neither_tensorflow_nor_torch(
        "import genaug.trainer.reference.train, genaug.trainer.hardware.devices\n"
        "import genaug.trainer.checks.instruments, genaug.trainer.reference.config\n"
        "import genaug.trainer.reference.summary, genaug.feeding.preflight\n"
        "import genaug.feeding.labels, genaug.trainer.checks.diagnose\n"
        "import genaug.trainer.hardware.host\n"
        "import genaug.doctor\n"
    )


def test_every_train_config_field_is_a_flag_named_after_it() -> None:
    """One source per setting: the flags come from TrainConfig (issue 10)."""
    import argparse
    from dataclasses import MISSING, fields

    from genaug.trainer.reference.config import TrainConfig, add_train_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    flags = {s for a in parser._actions for s in a.option_strings}
    for f in fields(TrainConfig):
        assert "--" + f.name.replace("_", "-") in flags, f.name
    # no arguments: exactly the dataclass defaults
    assert config_from_args(parser.parse_args([])) == TrainConfig()
    defaults = {f.name: f.default for f in fields(TrainConfig) if f.default is not MISSING}
    assert defaults["feeder_wait_s"] == 0.0 and defaults["cache"] is True
    args = parser.parse_args([
        "--gpus", "1,2", "--prompt", "I=a wound", "--prompts", "P=another", "--label-map",
        "I=i", "--rebalance", "1,1,4", "--no-cache", "--feeder-wait-s", "2.5",
        "--feeder-interval", "0.1", "--no-strict", "--steps-per-epoch", "3",
    ])
    config = config_from_args(args)
    assert config == TrainConfig(
        gpus=[1, 2], prompts={"I": "a wound", "P": "another"}, label_map={"I": "i"},
        rebalance=[1.0, 1.0, 4.0], cache=False, feeder_wait_s=2.5, feeder_interval_s=0.1,
        strict=False, steps_per_epoch=3,
    )


def test_importing_the_package_adds_no_import_hook() -> None:
    """Only the package's own module paths exist: importing ``genaug.trainer`` leaves
    ``sys.meta_path`` alone, and ``genaug.trainer.diagnose`` stays the public function (checked
    in a child, so no earlier import in this process decides the order)."""
    code = (
        "import importlib, sys\n"
        "before = list(sys.meta_path)\n"
        "import genaug.trainer\n"
        "assert sys.meta_path == before, sys.meta_path\n"
        "try:\n"
        "    importlib.import_module('genaug.trainer.need')\n"
        "except ModuleNotFoundError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('genaug.trainer.need still imports')\n"
        "from genaug.trainer import diagnose\n"
        "import genaug.trainer.checks.diagnose\n"
        "from genaug.trainer import diagnose as again\n"
        "assert callable(again) and again is diagnose, again\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
