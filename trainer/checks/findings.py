"""What :func:`~genaug.trainer.checks.diagnose.diagnose` reports, and the judgements behind it.

This module holds the report (:class:`DiagnoseReport`: ``problems``, ``figures`` and the
printed table), its items (:class:`Problem`: ``code``, ``message``, ``fix``), the things a test
or an unusual host injects (:class:`DiagnoseEnv`, :class:`DeviceMemory`), and the judgements
that turn measured figures into problems. Every judgement is a pure function of numbers and
strings, so it is unit-tested without TensorFlow; a diagnosis
(:mod:`~genaug.trainer.checks.session`) measures and calls them.

Nothing here imports TensorFlow at module import time.

Example::

    report = diagnose(ds, model)
    for p in report.problems:
        print(p.code, p.message, "fix:", p.fix)
    report.figures["input_wait_share"]     # e.g. 0.02
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from ..hardware.nvml import GpuInfo

__all__ = [
    "CODES",
    "INPUT_BOUND_MIN_WAIT_S",
    "INPUT_BOUND_SHARE",
    "OOM_RISK_SHARE",
    "DeviceMemory",
    "DiagnoseEnv",
    "DiagnoseReport",
    "Problem",
    "input_bound",
    "memory_estimate",
    "retrace_findings",
    "xla_failure",
]

CODES = (
    "python-op", "retracing", "input-bound", "nan", "empty-class", "oom-risk", "xla",
    "gpu-overlap",
)
"""Every problem code, in the order the table lists them."""

INPUT_BOUND_SHARE = 0.5
"""Input-bound above this share of step time spent waiting for the next batch (and a median
step waiting at least half as much, so one hiccup of a loaded machine is not a finding). Half:
``next()`` on a distributed iterator costs a millisecond or two of Python even when the
prefetch buffer is full, a sizeable share of a small model's step."""

INPUT_BOUND_MIN_WAIT_S = 0.001
"""Waits below a millisecond per step are never what slows a run down."""

OOM_RISK_SHARE = 0.9
"""Out-of-memory risk when a step's peak device memory is above this share of the device."""

_GB = 1e9
_MB = 1e6


@dataclass(frozen=True)
class Problem:
    """One finding of :func:`~genaug.trainer.checks.diagnose.diagnose`: a code from :data:`CODES`,
    what was found and the one line of what to change."""

    code: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.code}: {self.message}\n  fix: {self.fix}"


@dataclass
class DiagnoseReport:
    """The result of :func:`~genaug.trainer.checks.diagnose.diagnose` (or of the callback's first
    epoch). ``checked`` says, per code, ``"ok"``, ``"problem"`` or ``"not checked: why"``.

    Example::

        report = diagnose(ds, model)
        report.ok                  # no problem found
        print(report.format())     # the table diagnose prints
    """

    problems: list[Problem] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    checked: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def codes(self) -> list[str]:
        """The codes of the problems found, in table order, each once."""
        found = {p.code for p in self.problems}
        return [c for c in CODES if c in found]

    def add(self, code: str, message: str, fix: str) -> None:
        self.problems.append(Problem(code, message, fix))
        self.checked[code] = "problem"

    def passed(self, code: str) -> None:
        self.checked.setdefault(code, "ok")

    def skipped(self, code: str, why: str) -> None:
        self.checked.setdefault(code, f"not checked: {why}")

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly copy."""
        return asdict(self)

    def format(self) -> str:
        """The table: one row per code, then each problem with its fix."""
        f = self.figures
        head = (
            f"genaug diagnose: {f.get('steps', 0)} steps, global batch "
            f"{f.get('global_batch', '?')} on {f.get('replicas', '?')} replica(s)"
        )
        if f.get("step_ms_median") is not None:
            head += (f"; median step {f['step_ms_median']:.1f} ms, input wait "
                     f"{100 * (f.get('input_wait_share') or 0.0):.0f}%")
        lines = [head]
        for code in CODES:
            state = self.checked.get(code, "not checked")
            mark = "PROBLEM" if state == "problem" else "ok" if state == "ok" else "-"
            detail = "" if state in ("ok", "problem") else state.removeprefix("not checked: ")
            lines.append(f"  {code:<12} {mark:<8} {detail}".rstrip())
        if self.problems:
            lines.append(f"{len(self.problems)} problem(s):")
            lines.extend(f"  {p.code}: {p.message}\n    fix: {p.fix}" for p in self.problems)
        else:
            lines.append("no problem found")
        return "\n".join(lines)


class DeviceMemory(Protocol):
    """Peak device memory of a step, and the device's size (bytes); ``None`` where the
    device cannot say. :func:`~genaug.trainer.checks.diagnose.diagnose` uses TensorFlow's GPU
    allocator statistics (``tf.config.experimental.get_memory_info``, GPUs only) and NVML's
    total; a test passes its own to exercise the estimate without a GPU."""

    name: str

    def capacity(self) -> int | None: ...

    def measure(self, run: Callable[[], int]) -> int | None:
        """Call ``run`` (one training step; it returns the step's per-replica batch size) and
        return the peak bytes the step used."""
        ...


@dataclass
class DiagnoseEnv:
    """What :func:`~genaug.trainer.checks.diagnose.diagnose` otherwise asks the host for.

    Attributes:
        service_url: the genaug service whose GPU must stay apart from TensorFlow's (default:
            ``GENAUG_URL`` when set; no URL: the gpu-overlap check is skipped).
        service_info: its ``/v1/info`` answer (default: asked at ``service_url``).
        gpu_table: the local GPUs as NVML lists them (default: NVML).
        environ: the environment (``CUDA_VISIBLE_DEVICES``; default ``os.environ``).
        visible_gpus: TensorFlow's visible GPU indices (default: ``tf.config``).
        memory: the device memory probe (default: TensorFlow's GPU statistics; none on a
            machine without GPU).
    """

    service_url: str | None = None
    service_info: Mapping[str, Any] | None = None
    gpu_table: Sequence[GpuInfo] | None = None
    environ: Mapping[str, str] | None = None
    visible_gpus: Sequence[int] | None = None
    memory: DeviceMemory | None = None


# ----------------------------------------------------------------------------- judgements


def input_bound(waits: Sequence[float], totals: Sequence[float]) -> tuple[float, bool]:
    """(share of step time spent waiting for input, whether that makes the run input-bound).

    Steady steps only (the caller drops the first, which traces). Bound when the share is
    above :data:`INPUT_BOUND_SHARE`, the median step's own share is at least half of that
    (an input-bound pipeline makes every step wait, a loaded machine a few) and the median
    wait is at least :data:`INPUT_BOUND_MIN_WAIT_S` (a model that does next to nothing waits
    a large share of almost no time). Both medians are the lower middle value: with an even
    count the mean of the middle two would let one step the scheduler preempted (a few
    milliseconds on a busy machine) stand for every step of a short diagnosis.
    """
    if not totals or sum(totals) <= 0:
        return 0.0, False
    share = sum(waits) / sum(totals)
    median_share = statistics.median_low(
        w / t for w, t in zip(waits, totals, strict=True) if t > 0)
    bound = (share > INPUT_BOUND_SHARE and median_share > INPUT_BOUND_SHARE / 2
             and statistics.median_low(waits) >= INPUT_BOUND_MIN_WAIT_S)
    return share, bound


Leaf = tuple[str, tuple[int | None, ...] | None, str]
"""One leaf of a batch: (argument path, shape or ``None`` for a Python value, dtype or the
value's repr)."""

_RETRACE_FIXES = {
    "value": "pass that argument as a tensor (tf.constant) or keep it constant: every new "
             "Python value traces the step again",
    "shape": "give every batch one shape: pad variable-length data to a fixed length "
             "(padded_batch(B, padded_shapes=..., drop_remainder=True)) or resize in the map",
    "batch": "batch with drop_remainder=True (a smaller last batch has another shape) and keep "
             "the batch size fixed",
    "dtype": "cast to one dtype in the input pipeline (tf.cast in the map)",
    "structure": "yield the same structure from every batch (the same keys and arguments)",
    "none": "keep the train function and what it captures fixed between steps (a new "
            "tf.function or optimizer per call traces again)",
}


def _shape(shape: tuple[int | None, ...]) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + ")"


def retrace_findings(before: Sequence[Leaf], after: Sequence[Leaf]) -> tuple[list[str], str]:
    """(what differs between the batch of the last trace and the batch that traced again,
    the fix), e.g. ``(["x changed shape (8, 37) -> (8, 41)"], "give every batch one ...")``."""
    old = {p: (s, d) for p, s, d in before}
    new = {p: (s, d) for p, s, d in after}
    changes: list[str] = []
    kinds: set[str] = set()
    for path in dict.fromkeys([*old, *new]):
        a, b = old.get(path), new.get(path)
        if a == b:
            continue
        if a is None or b is None:
            kinds.add("structure")
            changes.append(f"{path} {'appeared' if a is None else 'disappeared'}")
            continue
        (sa, da), (sb, db) = a, b
        if sa is None or sb is None:
            kinds.add("value")
            changes.append(f"{path} (a Python value) changed {da} -> {db}")
        elif da != db:
            kinds.add("dtype")
            changes.append(f"{path} changed dtype {da} -> {db}")
        else:
            same_rest = len(sa) == len(sb) and sa[1:] == sb[1:]
            kinds.add("batch" if same_rest else "shape")
            changes.append(f"{path} changed shape {_shape(sa)} -> {_shape(sb)}")
    if not changes:
        return ["no argument changed"], _RETRACE_FIXES["none"]
    kind = next(k for k in ("value", "shape", "batch", "dtype", "structure") if k in kinds)
    return changes, _RETRACE_FIXES[kind]


def memory_estimate(
    *, peak_full: int, peak_half: int | None, batch: int, half: int, capacity: int | None,
    replicas: int,
) -> dict[str, Any]:
    """Peak device memory at the per-replica ``batch`` (and at ``half``), the per-example
    and fixed parts of a linear fit, and the largest global batch that fits in ``capacity``.
    """
    out: dict[str, Any] = {"peak_bytes": peak_full, "capacity_bytes": capacity}
    if capacity:
        out["peak_share"] = round(peak_full / capacity, 3)
    if peak_half is not None and batch > half > 0 and peak_full > peak_half:
        per_example = (peak_full - peak_half) / (batch - half)
        fixed = peak_full - per_example * batch
        out.update(peak_half_bytes=peak_half, per_example_bytes=int(per_example),
                   fixed_bytes=int(fixed))
        if capacity:
            out["largest_batch"] = max(0, int((capacity - fixed) // per_example)) * replicas
            out["safe_batch"] = max(
                0, int((OOM_RISK_SHARE * capacity - fixed) // per_example)) * replicas
    return out


def oom_problem(estimate: Mapping[str, Any], *, global_batch: int, device: str) -> str | None:
    """The oom-risk message, or ``None`` when the step's peak is below
    :data:`OOM_RISK_SHARE` of the device (or the device's size is unknown)."""
    capacity = estimate.get("capacity_bytes")
    peak = int(estimate["peak_bytes"])
    if not capacity or peak <= OOM_RISK_SHARE * capacity:
        return None
    text = (f"batch {global_batch} peaks at {peak / _GB:.2f} GB of the {capacity / _GB:.2f} "
            f"GB of {device} ({100 * peak / capacity:.0f}%)")
    if "largest_batch" in estimate:
        text += (f"; the largest batch that fits is about {estimate['largest_batch']} "
                 f"({estimate['per_example_bytes'] / _MB:.0f} MB per example + "
                 f"{estimate['fixed_bytes'] / _GB:.2f} GB fixed, from two batch sizes)")
    return text


def oom_fix(estimate: Mapping[str, Any], *, global_batch: int) -> str:
    safe = estimate.get("safe_batch")
    batch = f"batch {safe} or less" if safe else f"a batch below {global_batch}"
    return (f"train with {batch}, smaller images, or mixed precision "
            "(keras.mixed_precision.set_global_policy('mixed_float16'))")


def xla_failure(text: str) -> tuple[str, str]:
    """(message, fix) for the error XLA raised on a step: the op and node it fails on.

    Example::

        xla_failure("libdevice not found at ./libdevice.10.bc ... [[{{node adam/Pow_747}}]]")
        # ('XLA could not compile the step: libdevice not found at ./libdevice.10.bc, at
        #   node adam/Pow_747', 'point XLA at CUDA: export XLA_FLAGS=... ')
    """
    node = re.search(r"\{\{node ([^}]+)\}\}", text)
    op = re.search(r"No registered '([^']+)' OpKernel for (\w+)", text)
    where = f", at node {node.group(1)}" if node else ""
    libdevice = re.search(r"libdevice not found at (\S+)", text)
    if libdevice:
        return (f"XLA could not compile the step: libdevice not found at {libdevice.group(1)}"
                f"{where}", "point XLA at CUDA: export XLA_FLAGS=--xla_gpu_cuda_data_dir=<the "
                "CUDA root holding nvvm/libdevice> (genaug doctor finds it), or "
                "compile(..., jit_compile=False)")
    if op:
        return (f"XLA could not compile the step: op {op.group(1)} has no XLA kernel on "
                f"{op.group(2)}{where}", f"keep {op.group(1)} out of the compiled step (do it "
                "in the tf.data pipeline, or with another op), or compile(..., "
                "jit_compile=False)")
    first = text.strip().splitlines()[0][:300] if text.strip() else "unknown error"
    return (f"XLA could not compile the step: {first}{where}",
            "compile(..., jit_compile=False), or replace the op named above")


def is_xla_error(text: str) -> bool:
    return any(k in text for k in ("XLA", "JIT compilation failed", "libdevice",
                                   "_XlaMustCompile"))


def function_label(name: str | None) -> str:
    """``__inference_Dataset_map_apply_augmentation_36`` -> ``Dataset_map_apply_augmentation``."""
    if not name:
        return "the top-level graph"
    return re.sub(r"_\d+$", "", name.removeprefix("__inference_"))
