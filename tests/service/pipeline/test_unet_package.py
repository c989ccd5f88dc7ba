"""The UNet package's rules, one component at a time (the built and loaded package is
``test_warm_start.py``'s, slow): which options keep the UNet as a package, and which calls a
loaded package takes (the rest go to the compiled path)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from genaug.service.pipeline.acceleration_options import AccelerationOptions
from genaug.service.pipeline.unet_package import PackagedForward, packaging_refusal


@pytest.mark.parametrize(("options", "adapters", "turbo", "why"), [
    (AccelerationOptions(compile="unet"), False, False, None),
    (AccelerationOptions(compile="regional"), False, False, "GENAUG_COMPILE=regional"),
    (AccelerationOptions(compile="unet", compile_mode="max-autotune"), False, False,
     "GENAUG_COMPILE_MODE=max-autotune"),
    (AccelerationOptions(compile="unet", quantize="fp8"), False, False, "GENAUG_QUANTIZE=fp8"),
    (AccelerationOptions(compile="unet"), True, False, "LoRA adapters"),
    (AccelerationOptions(compile="unet"), False, True, "turbo LoRA"),
])
def test_the_unet_is_packaged_only_where_the_package_is_the_same_unet(
        options: AccelerationOptions, adapters: bool, turbo: bool, why: str | None) -> None:
    said = packaging_refusal(options, adapters=adapters, turbo=turbo)
    assert (said is None) if why is None else (said is not None and why in said), said


def _call(rows: int, size: int = 8, **extra: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    args = (torch.zeros(rows, 4, size, size), torch.tensor(500.0))
    kwargs = {"encoder_hidden_states": torch.zeros(rows, 77, 96), "timestep_cond": None,
              "added_cond_kwargs": {"text_embeds": torch.zeros(rows, 32),
                                    "time_ids": torch.zeros(rows, 6)},
              "return_dict": False, **extra}
    return args, kwargs


def test_a_loaded_package_takes_its_own_calls_and_leaves_the_rest_to_the_compiled_path(
        ) -> None:
    ran: list[str] = []

    def runner(sample: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        ran.append("package")
        return sample + 1

    def compiled(*args: Any, **kwargs: Any) -> tuple[torch.Tensor]:
        ran.append("compiled")
        return (args[0],)

    whole = PackagedForward({(8, 8): runner}, compiled, per_image=False)
    args, kwargs = _call(2)
    (noise,) = whole(*args, **kwargs)
    assert ran == ["package"] and float(noise[0, 0, 0, 0]) == 1.0
    for args, kwargs in (_call(2, size=16),                       # another latent size
                         _call(64),                               # more rows than it takes
                         _call(2, timestep_cond=torch.zeros(2, 4)),
                         _call(2, return_dict=True),
                         _call(2, cross_attention_kwargs={"scale": 0.5})):
        whole(*args, **kwargs)
    assert ran == ["package"] + ["compiled"] * 5 and (whole.calls, whole.fallbacks) == (1, 5)
    per_image = PackagedForward({(8, 8): runner}, compiled, per_image=True)
    per_image(*_call(1)[0], **_call(1)[1])
    per_image(*_call(2)[0], **_call(2)[1])  # a per-image package takes one row only
    assert (per_image.calls, per_image.fallbacks) == (1, 1)
