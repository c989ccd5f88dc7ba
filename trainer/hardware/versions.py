"""The doctor's ``versions`` check: the trainer's framework (TensorFlow and Keras, or torch),
the NVIDIA driver against the CUDA that framework was built for, genaug here and at the
service. Pure judgements of a :class:`~genaug.trainer.hardware.host.Host`'s facts.

Example::

    check_versions(Host.this_machine(), "0.9.0")        # a TensorFlow trainer
    check_torch_versions(Host.this_machine(), None)     # a PyTorch trainer (genaug.torch)
"""

from __future__ import annotations

import re

from genaug import __version__

from .host import Check, Host, ok

__all__ = ["check_torch_versions", "check_versions"]


def _cuda_pair(text: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", str(text))
    return (int(match.group(1)), int(match.group(2))) if match else None


def _driver_cuda(host: Host) -> tuple[int, int] | None:
    """The CUDA version the host's driver supports, (major, minor), or None."""
    if not host.driver_cuda:
        return None
    return host.driver_cuda // 1000, (host.driver_cuda % 1000) // 10


def _driver_text(driver: str, cuda: tuple[int, int] | None) -> str:
    return f"NVIDIA driver {driver}" + (f" (CUDA {cuda[0]}.{cuda[1]})" if cuda else "")


def _same_genaug(found: str, service_version: str | None) -> Check:
    """The versions check's last word: genaug here against the service's."""
    if service_version and service_version != __version__:
        return Check("versions", "warn", f"{found}: the client and the service differ",
                     f"install genaug {service_version} here, or upgrade the service to "
                     f"{__version__}")
    return ok("versions", found)


def check_versions(host: Host, service_version: str | None) -> Check:
    """TensorFlow, Keras, the driver against TensorFlow's CUDA, genaug here and there."""
    tf_version, keras_version = host.packages.get("tensorflow"), host.packages.get("keras")
    parts = [f"TensorFlow {tf_version or 'absent'}", f"Keras {keras_version or 'absent'}"]
    build = host.build_info or {}
    tf_cuda = _cuda_pair(build.get("cuda_version", "")) if build.get("is_cuda_build") else None
    driver_cuda = _driver_cuda(host)
    if host.driver:
        parts.append(_driver_text(host.driver, driver_cuda))
    if tf_cuda:
        parts.append(f"TensorFlow built for CUDA {tf_cuda[0]}.{tf_cuda[1]}")
    parts.append(f"genaug {__version__} here"
                 + (f", {service_version} at the service" if service_version else ""))
    found = ", ".join(parts)
    if tf_version is None:
        return Check("versions", "fail", f"{found}: TensorFlow is not installed",
                     "pip install 'genaug[trainer]'")
    if keras_version is None or not keras_version.split(".")[0].isdigit() \
            or int(keras_version.split(".")[0]) < 3:
        return Check("versions", "fail", f"{found}: genaug's trainer needs Keras 3",
                     "pip install 'keras>=3' (TensorFlow 2.16+ uses it)")
    if tf_cuda and driver_cuda and host.gpu_table:
        if driver_cuda[0] < tf_cuda[0]:
            return Check("versions", "fail", (
                f"{found}: the driver is older than the CUDA TensorFlow needs; TensorFlow "
                "would find no GPU"),
                f"install an NVIDIA driver for CUDA {tf_cuda[0]}.{tf_cuda[1]} or newer, or a "
                "TensorFlow built for your driver's CUDA")
        if driver_cuda < tf_cuda:
            return Check("versions", "warn", (
                f"{found}: the driver's CUDA is older than TensorFlow's (minor-version "
                "compatibility runs it, but PTX compiled for the newer CUDA fails)"),
                f"update the NVIDIA driver to one for CUDA {tf_cuda[0]}.{tf_cuda[1]}")
    return _same_genaug(found, service_version)


def check_torch_versions(host: Host, service_version: str | None) -> Check:
    """For a PyTorch trainer (``genaug doctor --trainer torch``): torch, the driver against
    torch's CUDA (from its version's ``+cuXYZ``), genaug here and there."""
    version = host.packages.get("torch")
    parts = [f"torch {version or 'absent'}"]
    match = re.search(r"\+cu(\d+)(\d)$", version or "")
    torch_cuda = (int(match.group(1)), int(match.group(2))) if match else None
    driver_cuda = _driver_cuda(host)
    if host.driver:
        parts.append(_driver_text(host.driver, driver_cuda))
    parts.append(f"genaug {__version__} here"
                 + (f", {service_version} at the service" if service_version else ""))
    found = ", ".join(parts)
    if version is None:
        return Check("versions", "fail", f"{found}: torch is not installed",
                     "pip install 'genaug[torch]'")
    if torch_cuda and driver_cuda and host.gpu_table and driver_cuda[0] < torch_cuda[0]:
        return Check("versions", "fail", (
            f"{found}: the driver is older than the CUDA torch was built for; torch would find "
            "no GPU"), f"install an NVIDIA driver for CUDA {torch_cuda[0]}.{torch_cuda[1]} or "
            "newer, or a torch wheel built for your driver's CUDA")
    return _same_genaug(found, service_version)
