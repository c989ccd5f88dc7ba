"""``genaug.trainer.checks.diagnose`` on small reproductions of the seed reports (../shared/seeds/).

Every reproduction runs in ``_diagnose_child.py``, all of them in ONE TensorFlow interpreter
started once for this module (TensorFlow's start and the reference trainer's preparation are
most of the time). Each test reads its scenario's report: the code caught, the message naming
what was found, and the fix line naming what to change. ``clean`` is the reference trainer
with mixing: no problem at all. The cost goal and the false-alarm rate over 20 clean runs are
measured by ``bench/training/diagnose_cost.py`` (speed is measured in benchmarks, not asserted).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _tf_env import tf_child_env

HERE = Path(__file__).resolve().parent
CHILD = HERE / "_diagnose_child.py"
MARK = "GENAUG_RESULT "


@pytest.fixture(scope="module")
def child(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every scenario's report (``as_dict()``), plus the child's stdout (``_stdout``)."""
    env = tf_child_env()
    work = tmp_path_factory.mktemp("diagnose")
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, str(CHILD), str(work)], capture_output=True,
                              text=True, timeout=280, env=env, cwd=HERE)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the diagnose child did not finish within 280 s\n{exc.stderr!r}"[-4000:])
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        pytest.fail(f"the diagnose child failed (exit {proc.returncode})\n--- stdout ---\n"
                    f"{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-6000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len(MARK):])
    result["_stdout"] = proc.stdout
    result["_wall_s"] = round(time.monotonic() - t0, 1)
    return result


def problems(report: dict[str, Any], code: str) -> list[dict[str, str]]:
    return [p for p in report["problems"] if p["code"] == code]


def only(report: dict[str, Any], code: str) -> dict[str, str]:
    """The one problem of ``code``; fails if there is none or another code was reported."""
    found = problems(report, code)
    assert found, f"{code} not caught: {report['problems']} {report['checked']}"
    return found[0]


# ----------------------------------------------------------------------------- the eight codes


# A py_function map with no parallelism may also be input-bound (seed 004's story): on a
# loaded machine it is, and the diagnosis is then right to say so.
MAY_ALSO = {"python_op": {"input-bound"}}


@pytest.mark.parametrize(("scenario", "codes"), [
    ("python_op", {"python-op"}),
    ("retracing", {"retracing"}),
    ("input_bound", {"input-bound", "python-op"}),  # seed 004's cause is a numpy_function
    ("nan", {"nan"}),
    ("nan_input", {"nan"}),
    ("empty_class", {"empty-class"}),
    ("oom_risk", {"oom-risk"}),
    ("xla", {"xla"}),
    ("gpu_overlap", {"gpu-overlap"}),
    ("callback_retracing", {"retracing"}),
])
def test_each_reproduction_reports_its_code_and_nothing_else(
        child: dict[str, Any], scenario: str, codes: set[str]) -> None:
    report = child[scenario]
    found = set(report["figures"]["problems"])
    assert codes <= found <= codes | MAY_ALSO.get(scenario, set()), report["problems"]
    for p in report["problems"]:
        assert p["message"] and p["fix"], p
        assert report["checked"][p["code"]] == "problem"


def test_python_op_names_the_function_it_sits_in(child: dict[str, Any]) -> None:
    """Seed 000: the tf.py_function calling the generator inside the dataset map."""
    p = only(child["python_op"], "python-op")
    assert "EagerPyFunc in the dataset" in p["message"]
    assert "'Dataset_map_apply_augmentation'" in p["message"]
    assert "reservoir.mix()" in p["fix"] and "TensorFlow ops" in p["fix"]
    assert child["python_op"]["figures"]["replicas"] == 4  # under MirroredStrategy


def test_retracing_names_the_argument_and_its_shapes(child: dict[str, Any]) -> None:
    """Seed 002: batches padded to their own longest sequence retrace the step."""
    report = child["retracing"]
    p = only(report, "retracing")
    assert "x changed shape (4, 12) -> (4, 17)" in p["message"]
    assert "padded_batch" in p["fix"] and "padded_shapes" in p["fix"]
    assert report["figures"]["retrace_steps"] == [2]


def test_input_bound_names_the_wait_and_the_pipeline_fix(child: dict[str, Any]) -> None:
    """Seed 004: a slow tf.numpy_function, no parallel map, no prefetch."""
    report = child["input_bound"]
    p = only(report, "input-bound")
    assert "of step time is spent waiting for the next batch" in p["message"]
    assert "num_parallel_calls=tf.data.AUTOTUNE" in p["fix"]
    assert ".prefetch(tf.data.AUTOTUNE)" in p["fix"]
    assert p["fix"].startswith("replace the Python function in the dataset")
    assert report["figures"]["input_wait_share"] > 0.5
    py = only(report, "python-op")
    assert "PyFunc" in py["message"] and "tf.numpy_function" in py["message"]


def test_nan_loss_names_the_learning_rate(child: dict[str, Any]) -> None:
    """Seed 001: NaN/Inf losses with finite inputs: the fix names the rate to lower."""
    p = only(child["nan"], "nan")
    assert "the loss became" in p["message"] and "with finite inputs and labels" in p["message"]
    assert "lower the learning rate (now 1e+30)" in p["fix"] and "clipnorm" in p["fix"]


def test_nan_input_names_the_input(child: dict[str, Any]) -> None:
    p = only(child["nan_input"], "nan")
    assert p["message"] == "x holds NaN or Inf at step 3"
    assert "tf.debugging.check_numerics(x" in p["fix"]


def test_empty_class_real_and_synthetic(child: dict[str, Any]) -> None:
    """Seed 001's "0 items": class 2 has no real example and no synthetic one."""
    report = child["empty_class"]
    real, synthetic = problems(report, "empty-class")
    assert "class(es) [2] of 3 never appeared in 8 steps" in real["message"]
    assert "per class [64, 64, 0]" in real["message"]
    assert "a class folder with 0 images" in real["fix"]
    assert "holds no synthetic image of class(es) [2]" in synthetic["message"]
    assert "label_map" in synthetic["fix"] and "genaug pregenerate" in synthetic["fix"]


def test_oom_risk_estimates_the_largest_batch_from_two_sizes(child: dict[str, Any]) -> None:
    """Seed 003: batch 16 on a 6.16 GB GPU (the memory probe simulates the laptop GPU; the
    steps run for real, at batch 16 and then at 8)."""
    report = child["oom_risk"]
    p = only(report, "oom-risk")
    assert report["memory_calls"] == [16, 8]
    assert "batch 16 peaks at 7.40 GB of the 6.16 GB" in p["message"]
    assert "the largest batch that fits is about 12" in p["message"]
    assert "400 MB per example + 1.00 GB fixed" in p["message"]
    assert p["fix"].startswith("train with batch 11 or less")  # 90 % of the device
    assert "mixed_float16" in p["fix"]
    assert report["figures"]["largest_batch"] == 12


def test_xla_names_the_op_it_fails_on(child: dict[str, Any]) -> None:
    """Seed 003: one step compiled with XLA fails on an op without an XLA kernel."""
    p = only(child["xla"], "xla")
    assert "op AsString has no XLA kernel" in p["message"]
    assert "serialize_to_string" in p["message"]  # the node, so the layer
    assert "keep AsString out of the compiled step" in p["fix"]
    assert "jit_compile=False" in p["fix"]


def test_gpu_overlap_names_the_gpu_and_the_devices_to_keep(child: dict[str, Any]) -> None:
    """Seed 000: TensorFlow sees GPU 0, where the generator runs."""
    p = only(child["gpu_overlap"], "gpu-overlap")
    assert "TensorFlow can use GPU 0" in p["message"]
    assert "GPU-aaaa1111" in p["message"]
    assert "configure_devices(service_url='http://127.0.0.1:8000')" in p["fix"]
    assert "CUDA_VISIBLE_DEVICES=GPU-bbbb2222-0000-0000-0000-000000000000" in p["fix"]


def test_the_table_is_printed(child: dict[str, Any]) -> None:
    out = child["_stdout"]
    assert "genaug diagnose: 6 steps, global batch 16 on 4 replica(s)" in out
    assert "  python-op    PROBLEM" in out
    assert "  oom-risk     -        no GPU memory to measure" in out
    assert "    fix: " in out
    assert "no problem found" in out


# ---------------------------------------------------------------------------------- clean


def test_clean_reference_trainer_has_no_problem(child: dict[str, Any]) -> None:
    """The reference trainer with mixing: no problem in any run, nor in the callback's first
    epoch of a real fit; the model is put back as it was."""
    clean = child["clean"]
    assert clean["runs"] and all(codes == [] for codes in clean["runs"]), clean["runs"]
    report = clean["diagnose"]
    assert report["problems"] == []
    for code in ("python-op", "retracing", "input-bound", "nan", "empty-class"):
        assert report["checked"][code] == "ok", report["checked"]
    f = report["figures"]
    assert f["steps"] == 20 and f["replicas"] == 4 and f["traces"] == 0
    assert min(f["class_counts"]) > 0 and f["reservoir_fill"] == [32, 32, 32]
    assert clean["weights_restored"]
    callback = clean["callback"]
    assert callback["problems"] == [] and callback["figures"]["steps"] >= 2
    assert clean["trainer_timer_steps"] > callback["figures"]["steps"]  # fit went on


def test_train_doctor_prints_the_table_then_trains(child: dict[str, Any]) -> None:
    """``genaug train --doctor`` with a live service and its feeder: no problem, trains."""
    run = child["train_doctor"]
    assert run["exit"] == 0, run["stdout"]
    table, _, summary = run["stdout"].partition("no problem found")
    assert table.startswith("genaug diagnose: 20 steps, global batch 16 on 4 replica(s)")
    assert "  gpu-overlap  ok" in table and "  empty-class  ok" in table  # service asked
    assert "genaug train summary" in summary
    assert "step tracing     1 " in summary  # diagnose's steps reused fit's one trace
    assert "feeder           " in summary and ", 0 errors" in summary


def test_train_doctor_stops_before_training_on_a_problem(child: dict[str, Any]) -> None:
    run = child["train_doctor"]
    assert run["exploding_exit"] == 4
    assert "  nan          PROBLEM" in run["exploding_stdout"]
    assert "fix: lower the learning rate (now 1e+38) or clip gradients" in run["exploding_stdout"]
    assert "genaug train summary" not in run["exploding_stdout"]
