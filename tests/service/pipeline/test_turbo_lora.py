"""Turbo LoRAs: each kind's published layout read into ``load_lora_adapter``'s, and fused into a
copy of the UNet that computes what the unfused LoRA computes.

The files are written by ``bench/gpu/turbo_lora_file.py`` in each kind's published layout
(key names, ``.alpha`` entries, dtype and the 788 SDXL modules, rank 64), with shapes from a
UNet config: SDXL's (built on the ``meta`` device: no SDXL weight is ever made) or the tiny
model's. The reference for fusing is diffusers' own path: the raw file through
``StableDiffusionXLPipeline.lora_state_dict`` into ``load_lora_adapter`` (peft layers, the
file's alphas), on another copy of the UNet.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.gpu.turbo_lora_file import SDXL_UNET_CONFIG, write_turbo_lora
from genaug.service.pipeline.load import LoadedModel, load_model
from genaug.service.pipeline.quiet import quiet_diffusers
from genaug.service.pipeline.turbo_lora import (
    PUBLISHED_LAYOUTS,
    PUBLISHED_TARGETS,
    TURBO_KINDS,
    TurboLoraError,
    fuse_turbo_unet,
    layout_family,
    read_turbo_lora,
)

KINDS = tuple(TURBO_KINDS)
#: SDXL UNet modules a published turbo LoRA adapts, and its published sizes (module docstring).
SDXL_LAYERS = 788
PUBLISHED_MB = {"float16": 394, "float32": 787}
SCALE = 0.8


@pytest.fixture(scope="module")
def sdxl_config() -> dict[str, Any]:
    config: dict[str, Any] = json.loads(SDXL_UNET_CONFIG.read_text())
    return config


@pytest.fixture(scope="module")
def sdxl_unet(sdxl_config: dict[str, Any]) -> torch.nn.Module:
    """SDXL's UNet on the meta device: shapes, no memory."""
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        unet: torch.nn.Module = UNet2DConditionModel.from_config(  # type: ignore[no-untyped-call]
            sdxl_config)
    return unet


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    """A tiny model of its own (float32 on the CPU): nothing here may change the session's."""
    return load_model(source="tiny-random", unet_weights=None, device="cpu", dtype="auto")


def adapted(unet: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The modules of ``unet`` a published turbo LoRA adapts."""
    return {name: m for name, m in unet.named_modules()
            if isinstance(m, torch.nn.Linear | torch.nn.Conv2d)
            and any(name == t or name.endswith("." + t) for t in PUBLISHED_TARGETS)}


def layers(state: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{module: (lora_A, lora_B)}`` of a converted state dict, checking its key layout."""
    out = {}
    for key in state:
        assert key.startswith("unet.") and key.endswith((".lora_A.weight", ".lora_B.weight"))
        module = key.removeprefix("unet.").rsplit(".lora_", 1)[0]
        out[module] = (state[f"unet.{module}.lora_A.weight"],
                       state[f"unet.{module}.lora_B.weight"])
    return out


def unet_inputs(unet: Any, batch: int = 2) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A UNet call's arguments: the latents first, positionally (the tiny model runs each
    batch element alone, splitting its first argument)."""
    config = unet.config
    generator = torch.Generator().manual_seed(0)
    text = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim
    sample = torch.randn(batch, config.in_channels, 8, 8, generator=generator)
    return (sample, torch.tensor(500)), {
        "encoder_hidden_states": torch.randn(batch, 77, config.cross_attention_dim,
                                             generator=generator),
        "added_cond_kwargs": {"text_embeds": torch.randn(batch, text, generator=generator),
                              "time_ids": torch.tensor([[64.0, 64, 0, 0, 64, 64]] * batch)},
    }


# -- 1. the published layouts at SDXL size ---------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_published_size_file_maps_onto_every_sdxl_module_it_covers(
    kind: str, tmp_path: Path, sdxl_config: dict[str, Any], sdxl_unet: torch.nn.Module
) -> None:
    from safetensors import safe_open

    published = PUBLISHED_LAYOUTS[kind]
    path = write_turbo_lora(tmp_path / f"{kind}.safetensors", kind, sdxl_config)
    # The file is what the published one is: its key family, alphas, dtype and size.
    with safe_open(str(path), framework="pt") as handle:
        keys = list(handle.keys())
        dtypes = {handle.get_slice(k).get_dtype() for k in keys}
    assert layout_family(keys) == published.family
    assert sum(k.endswith(".alpha") for k in keys) == (SDXL_LAYERS if published.alpha else 0)
    assert len(keys) == SDXL_LAYERS * (3 if published.alpha else 2)
    assert dtypes == {"F16" if published.dtype == "float16" else "F32"}
    assert round(path.stat().st_size / 1e6) == PUBLISHED_MB[published.dtype]

    state = read_turbo_lora(path, kind)
    converted = layers(state)
    expected = adapted(sdxl_unet)
    assert len(expected) == SDXL_LAYERS
    assert sorted(converted) == sorted(expected)  # no key left over, no covered module missing
    for name, (down, up) in converted.items():
        module = expected[name]
        if isinstance(module, torch.nn.Linear):
            assert down.shape == (64, module.in_features), name
            assert up.shape == (module.out_features, 64), name
        else:
            assert isinstance(module, torch.nn.Conv2d)
            assert down.shape == (64, module.in_channels, *module.kernel_size), name
            assert up.shape == (module.out_channels, 64, 1, 1), name
    # The whole fuse, checks included, on the meta UNet: shapes only, no SDXL weight made.
    fused = fuse_turbo_unet(sdxl_unet, state)
    assert fused is not sdxl_unet and next(fused.parameters()).device.type == "meta"


def test_sgm_block_names_map_with_the_unet_config(
    tmp_path: Path, sdxl_config: dict[str, Any], sdxl_unet: torch.nn.Module
) -> None:
    """kohya's own SDXL names (its SGM UNet): no published turbo LoRA uses them, every one is
    still read. Diffusers maps the block numbers from the config's layers_per_block."""
    from safetensors.torch import save_file

    modules = dict(sdxl_unet.named_modules())
    sgm = {"lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q":
           "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q",
           "lora_unet_middle_block_1_proj_in": "mid_block.attentions.0.proj_in",
           "lora_unet_output_blocks_2_1_transformer_blocks_9_ff_net_2":
           "up_blocks.0.attentions.2.transformer_blocks.9.ff.net.2"}
    tensors = {}
    for key, name in sgm.items():
        linear = modules[name]
        assert isinstance(linear, torch.nn.Linear)
        tensors[f"{key}.lora_down.weight"] = torch.zeros(4, linear.in_features)
        tensors[f"{key}.lora_up.weight"] = torch.zeros(linear.out_features, 4)
        tensors[f"{key}.alpha"] = torch.tensor(4.0)
    path = tmp_path / "sgm.safetensors"
    save_file(tensors, str(path))
    state = read_turbo_lora(path, "lcm", unet_config=sdxl_config)
    assert sorted(layers(state)) == sorted(sgm.values())
    with pytest.raises(TurboLoraError, match="SGM blocks .* pass unet_config=unet.config"):
        read_turbo_lora(path, "lcm")


# -- 2. fused on the tiny model: what the unfused LoRA computes ------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_the_fused_copy_computes_what_the_injected_lora_computes(
    kind: str, tmp_path: Path, model: LoadedModel
) -> None:
    from diffusers import StableDiffusionXLPipeline
    from peft.tuners.tuners_utils import BaseTunerLayer
    from safetensors.torch import load_file

    unet = model.pipeline.unet
    before = {k: v.clone() for k, v in unet.state_dict().items()}
    # alpha half the rank: the alphas must be applied (scale 0.5), not just carried.
    path = write_turbo_lora(tmp_path / f"{kind}.safetensors", kind, dict(unet.config),
                            seed=3, alpha=32)
    fused = fuse_turbo_unet(unet, read_turbo_lora(path, kind), scale=SCALE)

    reference = copy.deepcopy(unet)
    with quiet_diffusers():
        state, alphas = StableDiffusionXLPipeline.lora_state_dict(
            load_file(str(path)), unet_config=unet.config)
        reference.load_lora_adapter(state, prefix="unet", network_alphas=alphas,
                                    adapter_name="turbo")
    reference.set_adapters(["turbo"], weights=[SCALE])
    assert sum(isinstance(m, BaseTunerLayer) for m in reference.modules()) == len(adapted(unet))

    args, kwargs = unet_inputs(unet)
    with torch.no_grad():
        base = unet(*args, **kwargs).sample
        want = reference(*args, **kwargs).sample
        got = fused(*args, **kwargs).sample
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert (got - base).abs().mean() > 100 * (got - want).abs().max()  # the LoRA does work

    # The served UNet is bit-identical, and still plain.
    after = unet.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    assert not any(isinstance(m, BaseTunerLayer) for m in unet.modules())
    # The copy is plain weights: no peft layer, no adapter config, same dtype and device.
    assert not any(isinstance(m, BaseTunerLayer) for m in fused.modules())
    assert not getattr(fused, "peft_config", None)
    assert all(type(m) in (torch.nn.Linear, torch.nn.Conv2d) for m in adapted(fused).values())
    assert {(p.dtype, p.device) for p in fused.parameters()} == {(unet.dtype, unet.device)}
    # ... and a UNet carrying peft layers is refused: its copy would keep them.
    with pytest.raises(TurboLoraError, match="carries LoRA adapter layers"):
        fuse_turbo_unet(reference, read_turbo_lora(path, kind))


def test_every_key_family_reads_to_the_same_weights(tmp_path: Path, model: LoadedModel) -> None:
    """Whatever family a kind's file really is in, it reads to the same state (the kohya,
    diffusers and peft spellings of one LoRA; a file unlike its kind's is only logged)."""
    config = dict(model.pipeline.unet.config)
    states = {
        family: read_turbo_lora(write_turbo_lora(tmp_path / f"{family}.safetensors", "lcm",
                                                 config, rank=4, seed=5, layout=family), "lcm")
        for family in ("kohya", "diffusers", "peft")
    }
    kohya = states.pop("kohya")
    for family, state in states.items():
        assert state.keys() == kohya.keys(), family
        assert all(torch.equal(state[k], v) for k, v in kohya.items()), family


# -- 3. errors: one line, the problem and the fix ---------------------------------------------


def one_line(info: pytest.ExceptionInfo[TurboLoraError]) -> str:
    message = str(info.value)
    assert "\n" not in message
    return message


def test_unreadable_or_unfitting_files_are_refused_with_the_fix(
    tmp_path: Path, model: LoadedModel, caplog: pytest.LogCaptureFixture
) -> None:
    from safetensors.torch import save_file

    unet = model.pipeline.unet
    config = dict(unet.config)
    good = write_turbo_lora(tmp_path / "lcm.safetensors", "lcm", config, rank=4)

    with pytest.raises(TurboLoraError) as info:
        read_turbo_lora(good, "sdxl-turbo")
    assert "unknown turbo LoRA kind 'sdxl-turbo'; use one of: lcm, lightning, hyper-sd, " \
           "tcd (GENAUG_TURBO_KIND" in one_line(info)

    with pytest.raises(TurboLoraError, match="does not exist; set GENAUG_TURBO_LORA"):
        read_turbo_lora(tmp_path / "missing.safetensors", "lcm")
    pickled = tmp_path / "lcm.bin"
    torch.save({"lora_unet_x.lora_down.weight": torch.zeros(1)}, pickled)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a safetensors file")
    for path in (pickled, garbage):
        with pytest.raises(TurboLoraError) as info:
            read_turbo_lora(path, "lightning")
        message = one_line(info)
        assert f"turbo LoRA {str(path)!r} (GENAUG_TURBO_LORA, kind lightning) is not a " \
               "safetensors file" in message
        assert "safetensors only (pickled .bin/.pt files can run code)" in message
        assert "sdxl_lightning_4step_lora.safetensors" in message

    text_only = tmp_path / "text.safetensors"
    te = "lora_te1_text_model_encoder_layers_0_self_attn_q_proj"
    te2 = "lora_te2_text_model_encoder_layers_0_mlp_fc1"
    save_file({f"{te}.lora_down.weight": torch.zeros(4, 32),
               f"{te}.lora_up.weight": torch.zeros(32, 4), f"{te}.alpha": torch.tensor(4.0),
               f"{te2}.lora_down.weight": torch.zeros(4, 64),
               f"{te2}.lora_up.weight": torch.zeros(128, 4)}, str(text_only))
    with pytest.raises(TurboLoraError) as info:
        read_turbo_lora(text_only, "tcd")
    message = one_line(info)
    assert "holds no UNet LoRA weights (only 4 text-encoder tensors" in message
    assert "point GENAUG_TURBO_LORA at the distillation's UNet LoRA, like h1t/TCD-SDXL-LoRA" \
        in message
    # Beside UNet weights, text-encoder weights are dropped, with a log line.
    from safetensors.torch import load_file

    mixed = tmp_path / "mixed.safetensors"
    save_file({**load_file(str(good)), **load_file(str(text_only))}, str(mixed))
    with caplog.at_level(logging.INFO, logger="genaug.service.pipeline.turbo_lora"):
        state = read_turbo_lora(mixed, "lcm")
    assert state.keys() == read_turbo_lora(good, "lcm").keys()
    assert "dropped 4 text-encoder LoRA tensors (turbo fuses the UNet only)" in caplog.text

    # A LoRA for another base: the same modules at other widths, or modules it lacks.
    wider = write_turbo_lora(tmp_path / "wider.safetensors", "lcm",
                             {**config, "block_out_channels": [32, 64]}, rank=4)
    with pytest.raises(TurboLoraError) as info:
        fuse_turbo_unet(unet, read_turbo_lora(wider, "lcm"))
    message = one_line(info)
    assert "turbo LoRA key unet.down_blocks.0.downsamplers.0.conv.lora_A.weight has shape " \
           "(4, 32, 3, 3), the UNet's Conv2d 'down_blocks.0.downsamplers.0.conv' needs " \
           "(4, 16, 3, 3); the LoRA is for another base model" in message
    state = read_turbo_lora(good, "lcm")
    state["unet.down_blocks.3.attentions.0.proj_in.lora_A.weight"] = torch.zeros(4, 16)
    state["unet.down_blocks.3.attentions.0.proj_in.lora_B.weight"] = torch.zeros(16, 4)
    with pytest.raises(TurboLoraError) as info:
        fuse_turbo_unet(unet, state)
    assert "names module 'down_blocks.3.attentions.0.proj_in', which the UNet lacks; the " \
           "LoRA is for another base model" in one_line(info)
    assert all(not k.startswith("down_blocks.3") for k, _ in unet.named_modules())
