"""What a training host has, read without importing TensorFlow, and the doctor's verdicts
on it: the GPUs TensorFlow would use against the generator's (NVML, ``CUDA_VISIBLE_DEVICES``),
XLA's libdevice, and host memory against the reservoir (the versions check is
:mod:`~genaug.trainer.hardware.versions`).

:class:`Host` gathers the facts (:meth:`Host.this_machine`); each ``check_*`` function is a
pure judgement of them returning a :class:`Check`, so tests pass fake device tables and
environments. ``genaug doctor`` (:mod:`genaug.doctor`) adds the checks that ask the service.

Example::

    host = Host.this_machine()
    check_xla(host)   # Check(name='xla', status='ok', message='TensorFlow (CUDA 12.5.1) finds ...')
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import nvml
from .devices import DeviceError, visible_after_hiding
from .gpus import cuda_order, match_service_gpu, service_device
from .nvml import GpuInfo

__all__ = [
    "LIBDEVICE",
    "MEMORY_WARN_SHARE",
    "Check",
    "Host",
    "check_gpus",
    "check_memory",
    "check_xla",
    "ok",
    "recipe_size",
    "reservoir_bytes",
]

LIBDEVICE = Path("nvvm") / "libdevice" / "libdevice.10.bc"
MEMORY_WARN_SHARE = 0.5
"""Warn when the reservoir would take more than this share of the available host memory
(the dataset, its cache and TensorFlow need the rest)."""

_GB = 1e9


@dataclass(frozen=True)
class Check:
    """One line of the doctor's answer; ``fix`` is empty when ``status`` is ``"ok"``.

    Example::

        Check("xla", "fail", "no nvvm/libdevice/libdevice.10.bc found",
              "export XLA_FLAGS=--xla_gpu_cuda_data_dir=/usr/local/cuda-12.5")
    """

    name: str
    status: str  # "ok" | "warn" | "fail"
    message: str
    fix: str = ""


def ok(name: str, message: str) -> Check:
    """A passed check (no fix)."""
    return Check(name, "ok", message)


@dataclass
class Host:
    """What the doctor reads from this machine; tests build one with fake values.

    Attributes:
        environ: the environment (``CUDA_VISIBLE_DEVICES``, ``XLA_FLAGS``...).
        gpu_table: the local GPUs as NVML lists them; ``None`` without NVML.
        driver: the NVIDIA driver version (``"550.54.15"``); ``None`` without NVML.
        driver_cuda: the newest CUDA the driver supports, as NVML says (``12040``).
        build_info: TensorFlow's ``tf.sysconfig.get_build_info()``; ``None`` when TensorFlow
            is not installed.
        packages: installed versions of ``tensorflow`` and ``keras`` (``None``: absent).
        available_memory: host memory available, bytes (``MemAvailable``).
        cuda_roots: where XLA looks for ``nvvm/libdevice`` without ``XLA_FLAGS``, in order.
        cuda_hints: other places a CUDA toolkit is often installed (a find there is a fix).

    Example::

        check_gpus(info, url, Host(environ={"CUDA_VISIBLE_DEVICES": "1"}, gpu_table=table))
        check_xla(Host.this_machine())
    """

    environ: Mapping[str, str] = field(default_factory=dict)
    gpu_table: Sequence[GpuInfo] | None = None
    driver: str | None = None
    driver_cuda: int | None = None
    build_info: Mapping[str, Any] | None = None
    packages: Mapping[str, str | None] = field(default_factory=dict)
    available_memory: int | None = None
    cuda_roots: Sequence[Path] = ()
    cuda_hints: Sequence[Path] = ()

    @classmethod
    def this_machine(cls) -> Host:
        """Everything read from this machine, without importing TensorFlow."""
        driver, driver_cuda = nvml.driver()
        packages = {name: _version(name) for name in ("tensorflow", "keras", "torch")}
        environ = dict(os.environ)
        return cls(
            environ=environ, gpu_table=nvml.gpus(), driver=driver, driver_cuda=driver_cuda,
            build_info=_tensorflow_build_info(), packages=packages,
            available_memory=_available_memory(), cuda_roots=_xla_cuda_roots(),
            cuda_hints=_cuda_hints(environ),
        )


# ----------------------------------------------------------------------------- the host


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _tensorflow_build_info() -> dict[str, Any] | None:
    """``tf.sysconfig.get_build_info()`` read from the installed file, without importing
    TensorFlow (seconds, and it would start CUDA): the file is one literal dict."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / "python" / "platform" / "build_info.py"
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "build_info" for t in node.targets)
                and isinstance(node.value, ast.Call) and node.value.args):
            try:
                return dict(ast.literal_eval(node.value.args[0]))
            except ValueError:
                return {}
    return {}


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _xla_cuda_roots() -> list[Path]:
    """Where XLA looks for libdevice when ``--xla_gpu_cuda_data_dir`` is not given: the
    pip CUDA compiler package beside TensorFlow (``tensorflow[and-cuda]``), the CUDA path
    TensorFlow was built with, and the working directory (hence seed 003's
    ``./libdevice.10.bc``)."""
    roots: list[Path] = []
    spec = importlib.util.find_spec("tensorflow")
    if spec is not None and spec.origin:
        roots.append(Path(spec.origin).parent.parent / "nvidia" / "cuda_nvcc")
    roots += [Path("/usr/local/cuda"), Path(".")]
    return roots


def _cuda_hints(environ: Mapping[str, str]) -> list[Path]:
    hints = [Path(environ[k]) for k in ("CUDA_HOME", "CUDA_PATH", "CUDA_DIR") if environ.get(k)]
    hints += sorted(Path("/usr/local").glob("cuda-*"), reverse=True)
    hints += [Path("/opt/cuda"), Path("/usr/lib/cuda"), Path("/usr/lib/nvidia-cuda-toolkit")]
    return hints


# ----------------------------------------------------------------------------- local checks


def check_gpus(info: Mapping[str, Any], url: str, host: Host) -> Check:
    """The GPUs TensorFlow would enumerate here, against the service's GPU."""
    device = service_device(info, url)
    table, environ = host.gpu_table, host.environ
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    cvd_text = "unset" if cvd is None else repr(cvd)
    if not device.on_cuda:
        return ok("gpus", f"the service runs on {device.name or device.type}: no GPU to keep "
                           f"apart{_gpu_list(table, environ)}")
    if table is None:
        if not device.local:
            return ok("gpus", f"the service runs on {device.name} of another host; NVML is "
                               "not available here to list this host's GPUs")
        return Check("gpus", "warn", (
            f"the service runs on {device.name} of this host, but NVML is not available to "
            "tell which GPU that is, nor which ones TensorFlow would use"),
            "pip install nvidia-ml-py (genaug[trainer]) and check the NVIDIA driver "
            "(nvidia-smi)")
    if device.cuda_uuid is None and device.pci_bus_id is None:
        return Check("gpus", "warn", (
            f"the service runs on {device.name} but does not say which GPU (no cuda_uuid or "
            "pci_bus_id in /v1/info: an older genaug service?)"),
            "upgrade the service, or list only the other GPUs in CUDA_VISIBLE_DEVICES "
            "(nvidia-smi -L shows their UUIDs)")
    found = match_service_gpu(table, device)
    if found is None:
        where = "another host" if not device.local else "no GPU NVML lists here"
        return ok("gpus", f"the service's GPU {device.cuda_uuid or device.pci_bus_id} is on "
                           f"{where}{_gpu_list(table, environ)}")
    order = cuda_order(table, environ)
    what = f"the service runs on GPU {found.index} ({found.name}, {found.uuid})"
    if order is None:
        return Check("gpus", "warn", (
            f"{what}; CUDA_VISIBLE_DEVICES={cvd_text} lists indices, and with GPU models "
            "mixed their order is CUDA's fastest-first, which NVML cannot tell"),
            "export CUDA_DEVICE_ORDER=PCI_BUS_ID, or list GPU UUIDs in CUDA_VISIBLE_DEVICES "
            "(nvidia-smi -L)")
    if found in order:
        others = [g for g in order if g != found]
        try:
            visible = visible_after_hiding(table, found, environ)
        except DeviceError:  # unreachable: order is known
            visible = ",".join(g.uuid for g in others)
        empty = '""'
        left = (f"; the other {len(others)} GPU(s) would remain" if others
                else "; no other GPU is left for TensorFlow (it would train on the CPU)")
        return Check("gpus", "warn", (
            f"TensorFlow would use GPU {found.index} ({found.name}) too (CUDA_VISIBLE_DEVICES "
            f"{cvd_text}): {what}, and TensorFlow takes most of a GPU's memory at start"
            f"{left}"), (
            f"export CUDA_VISIBLE_DEVICES={visible or empty} before training, or call "
            "genaug.trainer.configure_devices(service_url=...) first thing (genaug train "
            "--service does it)"))
    return ok("gpus", f"{what}; TensorFlow would not see it (CUDA_VISIBLE_DEVICES "
                       f"{cvd_text}){_gpu_list(table, environ)}")


def _gpu_list(table: Sequence[GpuInfo] | None, environ: Mapping[str, str]) -> str:
    if table is None:
        return ""
    order = cuda_order(table, environ)
    if order is None:
        return f"; this host has {len(table)} GPU(s)"
    if not order:
        return "; TensorFlow would see no GPU"
    return "; TensorFlow would use " + ", ".join(
        f"GPU {g.index} ({g.uuid[:12]})" for g in order)


def _xla_data_dir(environ: Mapping[str, str]) -> str | None:
    flags = environ.get("XLA_FLAGS", "")
    try:
        words = shlex.split(flags)
    except ValueError:
        words = flags.split()
    for i, word in enumerate(words):
        if word.startswith("--xla_gpu_cuda_data_dir="):
            return word.split("=", 1)[1]
        if word == "--xla_gpu_cuda_data_dir" and i + 1 < len(words):
            return words[i + 1]
    return None


def check_xla(host: Host) -> Check:
    """Where XLA would find libdevice when TensorFlow is a CUDA build (seed 003)."""
    build = host.build_info
    if build is None:
        return ok("xla", "TensorFlow is not installed here (see versions): nothing to compile")
    if not build.get("is_cuda_build"):
        return ok("xla", "TensorFlow is a CPU build: XLA compiles for the CPU and needs no "
                          "libdevice")
    has_gpu = bool(host.gpu_table)
    data_dir = _xla_data_dir(host.environ)
    cuda = build.get("cuda_version", "?")
    if data_dir is not None:
        if (Path(data_dir) / LIBDEVICE).is_file():
            return ok("xla", f"XLA_FLAGS sets --xla_gpu_cuda_data_dir={data_dir}, which holds "
                              f"{LIBDEVICE}")
        return Check("xla", "fail" if has_gpu else "warn", (
            f"XLA_FLAGS sets --xla_gpu_cuda_data_dir={data_dir}, but {Path(data_dir) / LIBDEVICE}"
            " does not exist: every XLA-compiled step fails ('libdevice not found')"),
            _libdevice_fix(host, cuda))
    for root in host.cuda_roots:
        if (root / LIBDEVICE).is_file():
            return ok("xla", f"TensorFlow (CUDA {cuda}) finds {root / LIBDEVICE} without "
                              "XLA_FLAGS")
    found = next((r for r in host.cuda_hints if (r / LIBDEVICE).is_file()), None)
    searched = ", ".join(str(r) for r in host.cuda_roots) or "nowhere"
    if found is not None:
        return Check("xla", "fail" if has_gpu else "warn", (
            f"libdevice is at {found / LIBDEVICE}, where XLA does not look ({searched}): "
            "every XLA-compiled step would fail ('libdevice not found at ./libdevice.10.bc')"),
            f"export XLA_FLAGS=--xla_gpu_cuda_data_dir={found}")
    status = "fail" if has_gpu else "warn"
    return Check("xla", status, (
        f"TensorFlow is a CUDA {cuda} build and no {LIBDEVICE} was found (looked in "
        f"{searched} and the usual CUDA folders): XLA-compiled steps would fail on a GPU"
        + ("" if has_gpu else " (no GPU here now)")), _libdevice_fix(host, cuda))


def _libdevice_fix(host: Host, cuda: Any) -> str:
    found = next((r for r in [*host.cuda_roots, *host.cuda_hints]
                  if (r / LIBDEVICE).is_file()), None)
    if found is not None:
        return f"export XLA_FLAGS=--xla_gpu_cuda_data_dir={found}"
    major = str(cuda).split(".")[0]
    return (f"pip install nvidia-cuda-nvcc-cu{major} (or tensorflow[and-cuda]), or install the "
            "CUDA toolkit and export XLA_FLAGS=--xla_gpu_cuda_data_dir=<its root>; or "
            "compile(..., jit_compile=False)")


def reservoir_bytes(labels: int, slots: int, height: int, width: int, channels: int) -> int:
    """Host bytes of ``SyntheticReservoir(labels, slots, (height, width, channels))``
    (uint8 images)."""
    return labels * slots * height * width * channels


def recipe_size(spec: Mapping[str, Any]) -> tuple[int, int, int]:
    """(height, width, channels) of the images a recipe serves."""
    height = int(spec.get("output_height") or spec.get("height") or 0)
    width = int(spec.get("output_width") or spec.get("width") or 0)
    return height, width, int(spec.get("channels") or 3)


def check_memory(detail: Mapping[str, Any] | None, slots: int, host: Host, *,
                 unsized: str = "pass --recipe") -> Check:
    """Host memory available against the reservoir ``genaug train`` would allocate for the
    recipe ``detail`` (``GET /v1/recipes/NAME``); without one, ``unsized`` says why."""
    available = host.available_memory
    if detail is None:
        return ok("memory", (
            f"{_gb(available)} available on this host; the reservoir is not sized ({unsized})"))
    labels = len(detail.get("labels") or [])
    height, width, channels = recipe_size(detail.get("spec") or {})
    need = reservoir_bytes(labels, slots, height, width, channels)
    found = (f"the reservoir for {labels} labels x {slots} slots of {height}x{width}x{channels}"
             f" takes {_gb(need)}; {_gb(available)} available")
    if available is None:
        return Check("memory", "warn", f"{found} (host memory unknown)",
                     "check free memory yourself (free -g)")
    if need > available:
        return Check("memory", "fail", f"{found}: it does not fit", (
            f"--slots-per-class {max(1, int(slots * available * MEMORY_WARN_SHARE / need))} "
            "or less, smaller images, or free host memory"))
    if need > MEMORY_WARN_SHARE * available:
        return Check("memory", "warn", (
            f"{found}: more than {100 * MEMORY_WARN_SHARE:.0f}% of it, before the dataset "
            "and TensorFlow"), (
            f"--slots-per-class {max(1, int(slots * available * MEMORY_WARN_SHARE / need))} "
            "or less, or smaller images"))
    return ok("memory", found)


def _gb(n: int | None) -> str:
    if n is None:
        return "? GB"
    return f"{n / _GB:.2f} GB" if n >= _GB else f"{n / 1e6:.1f} MB"
