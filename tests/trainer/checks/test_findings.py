"""The judgements of ``genaug.trainer.checks.findings``: pure functions of numbers and strings,
tested without TensorFlow (``test_diagnose.py`` runs them on real steps)."""

from __future__ import annotations

import sys

import pytest

from genaug.trainer.checks.findings import (
    CODES,
    INPUT_BOUND_SHARE,
    DiagnoseReport,
    function_label,
    input_bound,
    is_xla_error,
    memory_estimate,
    oom_fix,
    oom_problem,
    retrace_findings,
    xla_failure,
)

GB = 10**9


def test_no_tensorflow_imported() -> None:
    assert "tensorflow" not in sys.modules


# ----------------------------------------------------------------------------- input-bound


def test_input_bound_when_every_step_waits() -> None:
    share, bound = input_bound([0.030] * 10, [0.036] * 10)
    assert share == pytest.approx(0.833, abs=1e-3) and bound


def test_not_input_bound_with_a_full_prefetch_buffer() -> None:
    assert input_bound([0.0002] * 10, [0.012] * 10) == (pytest.approx(0.0167, abs=1e-3), False)


def test_one_hiccup_of_a_loaded_machine_is_not_input_bound() -> None:
    """One step waiting 0.5 s makes the share high; the median step does not wait."""
    waits, totals = [0.0002] * 9 + [0.5], [0.010] * 9 + [0.51]
    share, bound = input_bound(waits, totals)
    assert share > INPUT_BOUND_SHARE and not bound


def test_one_preempted_step_of_two_is_not_input_bound() -> None:
    """What CI's diagnosis of 3 steps measured beside a busy worker: the one steady step the
    scheduler preempted waited 4.7 ms, the other 0.2 ms (52% of the time, one step of two)."""
    share, bound = input_bound([0.0047, 0.0002], [0.0054, 0.0009])
    assert share > INPUT_BOUND_SHARE and not bound
    assert input_bound([0.0047, 0.0040], [0.0054, 0.0046])[1]  # both steps wait: bound


def test_a_model_that_does_nothing_waits_a_large_share_of_nothing() -> None:
    share, bound = input_bound([0.0004] * 10, [0.0005] * 10)
    assert share > INPUT_BOUND_SHARE and not bound  # median wait below a millisecond


def test_input_bound_without_steps() -> None:
    assert input_bound([], []) == (0.0, False)


# ----------------------------------------------------------------------------- retracing


def test_retrace_on_a_longer_sequence_asks_for_fixed_padding() -> None:
    changes, fix = retrace_findings([("x", (8, 37), "int32"), ("y", (8,), "int32")],
                                    [("x", (8, 41), "int32"), ("y", (8,), "int32")])
    assert changes == ["x changed shape (8, 37) -> (8, 41)"]
    assert "padded_batch" in fix and "fixed length" in fix


def test_retrace_on_a_smaller_last_batch_asks_for_drop_remainder() -> None:
    changes, fix = retrace_findings([("x", (32, 64, 64, 3), "float32")],
                                    [("x", (17, 64, 64, 3), "float32")])
    assert changes == ["x changed shape (32, 64, 64, 3) -> (17, 64, 64, 3)"]
    assert "drop_remainder=True" in fix


def test_retrace_on_a_python_value_asks_for_a_tensor() -> None:
    changes, fix = retrace_findings([("x", (8, 4), "float32"), ("x[1]", None, "0.5")],
                                    [("x", (8, 4), "float32"), ("x[1]", None, "0.25")])
    assert changes == ["x[1] (a Python value) changed 0.5 -> 0.25"]
    assert "tf.constant" in fix


def test_retrace_on_dtype_and_structure() -> None:
    changes, fix = retrace_findings([("x", (8,), "float32")], [("x", (8,), "float64")])
    assert changes == ["x changed dtype float32 -> float64"] and "tf.cast" in fix
    changes, fix = retrace_findings([("x", (8,), "float32")],
                                    [("x", (8,), "float32"), ("sample_weight", (8,), "float32")])
    assert changes == ["sample_weight appeared"] and "same structure" in fix


def test_retrace_with_nothing_changed_points_at_the_function() -> None:
    changes, fix = retrace_findings([("x", (8,), "float32")], [("x", (8,), "float32")])
    assert changes == ["no argument changed"] and "new tf.function" in fix


def test_a_python_value_change_wins_over_a_shape_change() -> None:
    """The fix names the cause that retraces on every value, the worst one."""
    _, fix = retrace_findings([("x", (8, 3), "float32"), ("lr", None, "1")],
                              [("x", (8, 5), "float32"), ("lr", None, "2")])
    assert "tf.constant" in fix


# ----------------------------------------------------------------------------- oom-risk


def seed_003(batch: int) -> int:
    """Seed 003's laptop: 1 GB fixed, 0.4 GB per 384x384 example."""
    return int(1.0 * GB + 0.4 * GB * batch)


def test_memory_estimate_fits_a_line_through_two_batch_sizes() -> None:
    est = memory_estimate(peak_full=seed_003(16), peak_half=seed_003(8), batch=16, half=8,
                          capacity=int(6.16 * GB), replicas=1)
    assert est["per_example_bytes"] == int(0.4 * GB)
    assert est["fixed_bytes"] == pytest.approx(1.0 * GB, rel=1e-6)
    assert est["largest_batch"] == 12  # (6.16 - 1) / 0.4 = 12.9
    assert est["safe_batch"] == 11  # within 90 %: (5.544 - 1) / 0.4 = 11.4


def test_memory_estimate_counts_the_global_batch_over_replicas() -> None:
    est = memory_estimate(peak_full=seed_003(16), peak_half=seed_003(8), batch=16, half=8,
                          capacity=int(6.16 * GB), replicas=4)
    assert est["largest_batch"] == 48


def test_memory_estimate_with_one_size_only_gives_the_peak() -> None:
    est = memory_estimate(peak_full=seed_003(16), peak_half=None, batch=16, half=0,
                          capacity=int(6.16 * GB), replicas=1)
    assert "largest_batch" not in est and est["peak_share"] == pytest.approx(1.201, abs=1e-3)


def test_oom_problem_above_ninety_percent() -> None:
    est = memory_estimate(peak_full=seed_003(16), peak_half=seed_003(8), batch=16, half=8,
                          capacity=int(6.16 * GB), replicas=1)
    text = oom_problem(est, global_batch=16, device="GPU:0")
    assert text is not None
    assert text.startswith("batch 16 peaks at 7.40 GB of the 6.16 GB of GPU:0 (120%)")
    assert "the largest batch that fits is about 12" in text
    assert oom_fix(est, global_batch=16).startswith("train with batch 11 or less")


def test_no_oom_problem_with_room_or_without_a_size() -> None:
    est = memory_estimate(peak_full=seed_003(8), peak_half=seed_003(4), batch=8, half=4,
                          capacity=int(6.16 * GB), replicas=1)
    assert oom_problem(est, global_batch=8, device="GPU:0") is None  # 4.2 of 6.16 GB
    est = memory_estimate(peak_full=seed_003(16), peak_half=None, batch=16, half=0,
                          capacity=None, replicas=1)
    assert oom_problem(est, global_batch=16, device="GPU:0") is None
    assert "a batch below 16" in oom_fix(est, global_batch=16)


# ----------------------------------------------------------------------------- xla


def test_xla_libdevice_missing_points_at_the_cuda_data_dir() -> None:
    """Seed 003's second failure, verbatim."""
    text = ("error: libdevice not found at ./libdevice.10.bc\nJIT compilation failed.\n"
            "\t [[{{node adam/Pow_747}}]]")
    assert is_xla_error(text)
    message, fix = xla_failure(text)
    assert message == ("XLA could not compile the step: libdevice not found at "
                       "./libdevice.10.bc, at node adam/Pow_747")
    assert "XLA_FLAGS=--xla_gpu_cuda_data_dir=" in fix and "genaug doctor" in fix


def test_xla_op_without_kernel_names_op_and_node() -> None:
    text = ("Detected unsupported operations when trying to compile graph ... "
            "No registered 'AsString' OpKernel for XLA_GPU_JIT devices compatible with node "
            "{{node model/serialize/AsString}}")
    message, fix = xla_failure(text)
    assert "op AsString has no XLA kernel on XLA_GPU_JIT" in message
    assert "at node model/serialize/AsString" in message
    assert "keep AsString out of the compiled step" in fix


def test_xla_other_failure_keeps_the_first_line() -> None:
    """Seed 003's first failure: the ConvNeXt normalization layer."""
    text = ("JIT compilation failed.\n [[{{node ConvNeXtV2_1/convnext_base_prestem_"
            "normalization_1/Sqrt}}]]")
    message, fix = xla_failure(text)
    assert message == ("XLA could not compile the step: JIT compilation failed., at node "
                       "ConvNeXtV2_1/convnext_base_prestem_normalization_1/Sqrt")
    assert "jit_compile=False" in fix
    assert not is_xla_error("Incompatible shapes: [8] vs. [4]")


# ----------------------------------------------------------------------------- the report


def test_function_label() -> None:
    assert function_label("__inference_Dataset_map_apply_augmentation_36") == \
        "Dataset_map_apply_augmentation"
    assert function_label(None) == "the top-level graph"


def test_report_table_and_codes() -> None:
    report = DiagnoseReport(figures={"steps": 20, "global_batch": 32, "replicas": 4,
                                     "step_ms_median": 11.8, "input_wait_share": 0.21})
    for code in CODES:
        report.passed(code)
    assert report.ok and report.format().endswith("no problem found")
    report.add("nan", "x holds NaN or Inf at step 3", "check the map")
    report.add("python-op", "EagerPyFunc in the dataset", "move it out")
    assert not report.ok and report.codes == ["python-op", "nan"]  # table order
    table = report.format()
    assert table.splitlines()[0] == ("genaug diagnose: 20 steps, global batch 32 on 4 "
                                     "replica(s); median step 11.8 ms, input wait 21%")
    assert "  nan          PROBLEM" in table and "    fix: check the map" in table
    assert report.as_dict()["problems"][0] == {
        "code": "nan", "message": "x holds NaN or Inf at step 3", "fix": "check the map"}


def test_skipped_checks_say_why() -> None:
    report = DiagnoseReport()
    report.skipped("oom-risk", "no GPU memory to measure")
    report.passed("oom-risk")  # a later pass does not hide why it was not checked
    assert report.checked["oom-risk"] == "not checked: no GPU memory to measure"
    assert "  oom-risk     -        no GPU memory to measure" in report.format()
