"""bench.gpu.fp8_diagnose stays ready for a GPU: on the CPU (``--tiny``: tiny-digits' UNet, the
hardware checks set aside) it runs every process and variant, and names what the GPU run is to
confirm: without an activation bound the unconditional rows of zeros make NaN at the first
cross-attention output projection, and the product's configuration draws finite."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.gpu.fp8_diagnose import VARIANTS, config_for, layer_family, verdict

ROOT = Path(__file__).resolve().parents[2]


def test_a_layers_family_is_the_part_every_block_repeats() -> None:
    name = "down_blocks.2.attentions.0.transformer_blocks.3.attn2.to_out.0"
    assert layer_family(name) == "attn2.to_out"
    assert layer_family("up_blocks.0.attentions.1.transformer_blocks.9.ff.net.0.proj") == (
        "ff.net.0.proj")
    assert layer_family("mid_block.attentions.0.proj_in") == "proj_in"
    assert layer_family("conv_in") == "conv_in"


def test_every_variant_has_a_configuration() -> None:
    pytest.importorskip("torchao")
    from genaug.service.pipeline.quantize import FP8_ACTIVATION_LB

    assert config_for("product") is None  # the product's own, from quantize_fp8
    assert config_for("no-lb").activation_value_lb is None
    assert config_for("no-fast-accum").activation_value_lb == FP8_ACTIVATION_LB
    for variant in VARIANTS:
        config_for(variant)
    with pytest.raises(ValueError, match="unknown variant"):
        config_for("int4")


def test_the_verdict_names_the_first_layer_and_the_skip_that_helps() -> None:
    runs = [
        {"variant": "product", "finite": True, "rel_error": 0.008},
        {"variant": "no-lb+skip", "finite": False, "skip": ["attn2.to_out"], "skip_finite": True,
         "first_nonfinite": {"name": "mid_block.attentions.0.transformer_blocks.0.attn2.to_out.0",
                             "quantized": True, "input_zero_rows": 4096,
                             "dequantized_finite": True}},
    ]
    (line,) = verdict([{"process": "default", "env": {"torchao": "0.18.0"}, "runs": runs},
                       {"process": "torchao-0.17", "skipped": "no wheel"}])
    assert line.startswith("default (torchao 0.18.0): finite: product;")
    assert "no-lb+skip NaN/Inf first at mid_block.attentions.0" in line
    assert "input zero rows 4096" in line and "finite with skip=['attn2.to_out']: True" in line


@pytest.mark.slow  # two child processes, each importing torch, diffusers and torchao: 20-60 s
def test_tiny_mode_finds_the_rows_of_zeros_and_the_fix(tmp_path: Path) -> None:
    pytest.importorskip("torchao")
    out = tmp_path / "fp8.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu.fp8_diagnose", "--tiny", "--variants",
         "product,no-lb,no-lb@random-uncond,no-lb+skip", "--json", str(out)],
        capture_output=True, text=True, timeout=400, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    default, skip_so, old = result["processes"]
    assert default["process"] == "default" and default["fp8_check"].startswith("set aside")
    assert default["bf16_finite"] and default["latent"] == 8
    runs = {r["variant"]: r for r in default["runs"]}
    assert runs["product"]["finite"] and runs["product"]["quantized_layers"] == 40
    assert 0 < runs["product"]["rel_error"] < 0.05  # FP8 drifts, a little
    assert runs["no-lb@random-uncond"]["finite"]  # no rows of zeros, no NaN
    first = runs["no-lb"]["first_nonfinite"]
    assert runs["no-lb"]["finite"] is False and first["quantized"]
    assert layer_family(first["name"]) == "attn2.to_out"
    # finite, and all zeros in its unconditional half (the conditional half is not)
    assert first["input_finite"] and first["input_amax"] > 0
    assert first["input_zero_rows"] == first["input_rows"] // 2 > 0
    assert first["dequantized_finite"]  # the weight is fine: the activation's scale of 0
    assert runs["no-lb+skip"]["skip"] == ["attn2.to_out"] and runs["no-lb+skip"]["skip_finite"]
    # The suspect processes ran in their own environment (or say why not).
    assert skip_so["env"]["skip_so_files"] == "1" and skip_so["runs"]
    assert "runs" in old or "no wheel in .whl/torchao-0.17/" in old["skipped"]
    assert any(line.startswith("default (torchao") for line in result["verdict"])
    assert "FP8 diagnosis: one UNet forward per variant" in proc.stdout
