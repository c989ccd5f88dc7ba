"""The attention kernel (service/pipeline/attention.py, GENAUG_ATTENTION): what each setting
resolves to on each kind of device, refusals in one line, applying and undoing torch's
process-wide choice, and what /v1/info reports.

The Hopper decisions are checked with torch's device queries replaced (there is no GPU here);
the kernels themselves run in bench/gpu/gpu_sdxl.py's attention rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from genaug.service.app import check_startup
from genaug.service.pipeline import attention
from genaug.service.pipeline.acceleration import AccelerationError
from genaug.service.pipeline.attention import (
    ATTENTION_CHOICES,
    AttentionChoice,
    apply_attention,
    choose_attention,
)
from genaug.service.pipeline.device import ModelLoadError
from genaug.service.settings import Settings
from genaug.service.testing import load_tiny, start_service

CPU = torch.device("cpu")
GPU = torch.device("cuda", 0)


def flags() -> tuple[bool, ...]:
    cuda = torch.backends.cuda
    return (cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(),
            cuda.math_sdp_enabled(), cuda.cudnn_sdp_enabled())


@pytest.fixture
def untouched() -> Iterator[None]:
    """torch's attention flags are process-wide: each test leaves them as it found them."""
    before = (flags(), list(torch._C._get_sdp_priority_order()))
    yield
    assert (flags(), list(torch._C._get_sdp_priority_order())) == before


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A CUDA device of a chosen compute capability, as choose_attention sees it."""
    def at(capability: tuple[int, int], *, cudnn: bool = True, fa3: bool = False) -> None:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(attention, "_cudnn_available", lambda: cudnn)
        monkeypatch.setattr(attention, "_fa3_installed", lambda: fa3)
    return at


def test_auto_on_the_cpu_is_torchs_own_choice() -> None:
    assert choose_attention("auto", CPU) == AttentionChoice("auto", "default")
    assert choose_attention("default", CPU) == AttentionChoice("default", "default")
    assert choose_attention("math", CPU) == AttentionChoice("math", "math")
    assert choose_attention("flash", CPU) == AttentionChoice("flash", "flash")


@pytest.mark.parametrize("kernel", ["cudnn", "efficient", "flash3"])
def test_a_cuda_kernel_on_the_cpu_is_refused_in_one_line(kernel: str) -> None:
    with pytest.raises(AccelerationError) as caught:
        choose_attention(kernel, CPU)
    message = str(caught.value)
    assert "\n" not in message
    assert f"GENAUG_ATTENTION={kernel}" in message
    assert "cpu has no compute capability (not a CUDA GPU)" in message
    assert "Set GENAUG_ATTENTION=auto" in message


def test_start_up_refuses_a_cuda_kernel_on_the_cpu() -> None:
    with pytest.raises(ModelLoadError, match="GENAUG_ATTENTION=cudnn is a CUDA kernel"):
        check_startup(Settings(device="cpu", attention="cudnn"))
    assert check_startup(Settings(device="cpu", attention="auto"))["type"] == "cpu"


def test_auto_on_hopper_prefers_flashattention3_then_cudnn(gpu: Any) -> None:
    gpu((9, 0), fa3=True)
    assert choose_attention("auto", GPU).backend == "flash3"
    gpu((9, 0), fa3=False)
    assert choose_attention("auto", GPU).backend == "cudnn"
    gpu((10, 0), fa3=True)  # FA3's kernels are Hopper's; Blackwell takes cuDNN
    assert choose_attention("auto", GPU).backend == "cudnn"
    gpu((9, 0), cudnn=False)
    assert choose_attention("auto", GPU).backend == "default"


@pytest.mark.parametrize("capability", [(8, 0), (8, 9), (7, 5)])
def test_auto_before_hopper_is_torchs_own_choice(gpu: Any, capability: tuple[int, int]) -> None:
    gpu(capability)
    assert choose_attention("auto", GPU).backend == "default"


def test_flash3_is_refused_off_hopper_and_without_its_package(gpu: Any) -> None:
    gpu((8, 0), fa3=True)
    with pytest.raises(AccelerationError,
                       match="compute capability 8.0. Set GENAUG_ATTENTION=auto"):
        choose_attention("flash3", GPU)
    gpu((9, 0), fa3=False)
    with pytest.raises(AccelerationError, match="flash_attn_interface.*not installed"):
        choose_attention("flash3", GPU)
    gpu((9, 0), fa3=True)
    assert choose_attention("flash3", GPU).backend == "flash3"


def test_settings_take_the_documented_names(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().attention == "auto"
    for name in ATTENTION_CHOICES:
        monkeypatch.setenv("GENAUG_ATTENTION", name)
        assert Settings().attention == name
    with pytest.raises(ValueError, match="attention"):
        Settings(attention="fastest")  # type: ignore[arg-type]
    with pytest.raises(AccelerationError, match="GENAUG_ATTENTION to one of"):
        choose_attention("fastest", CPU)


def test_a_forced_kernel_is_the_only_one_and_undo_restores_torchs_state(
    untouched: None,
) -> None:
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    reference = F.scaled_dot_product_attention(q, k, v)
    undo = apply_attention(AttentionChoice("math", "math"))
    try:
        assert flags() == (False, False, True, False)
        got = F.scaled_dot_product_attention(q, k, v)
        torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-5)
    finally:
        undo()


def test_auto_puts_its_kernel_first_and_keeps_the_others_behind_it(untouched: None) -> None:
    before = flags()
    cudnn = int(SDPBackend.CUDNN_ATTENTION)
    order_before = [int(b) for b in torch._C._get_sdp_priority_order()]
    assert order_before[0] != cudnn  # torch's own order (flash, efficient, math, cuDNN)
    undo = apply_attention(AttentionChoice("auto", "cudnn"))
    try:
        order = [int(b) for b in torch._C._get_sdp_priority_order()]
        assert order == [cudnn, *(b for b in order_before if b != cudnn)]
        assert flags() == before  # nothing disabled: shapes cuDNN cannot take still run
    finally:
        undo()


def test_default_is_torchs_own_state_even_after_another_choice(untouched: None) -> None:
    torch_state = (flags(), list(torch._C._get_sdp_priority_order()))
    undo_math = apply_attention(AttentionChoice("math", "math"))
    undo_cudnn = apply_attention(AttentionChoice("auto", "cudnn"))  # from torch's state
    try:
        assert flags() == (True, True, True, True)
        undo_default = apply_attention(AttentionChoice("default", "default"))
        assert (flags(), list(torch._C._get_sdp_priority_order())) == torch_state
        undo_default()  # back to what cudnn left: cuDNN first
        assert torch._C._get_sdp_priority_order()[0] == int(SDPBackend.CUDNN_ATTENTION)
    finally:
        undo_cudnn()
        assert flags() == (False, False, True, False)  # what math left
        undo_math()


def test_info_reports_the_setting_and_the_kernel_it_chose() -> None:
    with start_service(load_tiny(), attention="auto") as live:
        acceleration = httpx.get(live.url + "/v1/info", timeout=10).json()["acceleration"]
    assert (acceleration["attention"], acceleration["attention_backend"]) == ("auto", "default")
    assert (acceleration["quantize"], acceleration["quantized_layers"]) == ("none", 0)
    assert (acceleration["compile_mode"], acceleration["batch_sizes"]) == ("default", [])
