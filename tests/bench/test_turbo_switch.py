"""``bench.service.turbo_switch --quick`` runs its path: a synthetic turbo LoRA fused into a
copy of the tiny UNet, both modes drawn alternating and grouped, and the SDXL copy's size
counted on the meta device (the figures are the benchmark's, not asserted here)."""

from __future__ import annotations

from bench.service.turbo_switch import run


def test_the_switch_bench_runs_and_counts_a_second_unet() -> None:
    result = run(["--quick", "--threads", "1"])
    assert result["turbo_copy_bytes"] == result["first_unet_bytes"] > 0
    # SDXL's UNet: 2.57 B parameters, two bytes each in bfloat16.
    assert 5.0e9 < result["sdxl_turbo_copy_bytes_bf16"] < 5.3e9
    assert set(result["times"]) == {"alternating", "grouped"} and result["ratio"] > 0
