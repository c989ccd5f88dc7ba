"""``genaug pregenerate`` without ``--url`` generates in its own process, with the CPU threads
the service would use: ``GENAUG_TORCH_THREADS``, else all cores but one (torch's own default,
every core, fought the judge and the pool's store for them: 50 images took 238 s instead of
35 s on a busy 2-core machine). The command runs in this process (``genaug.cli.main``), so
torch's thread count is read afterwards as the command left it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from genaug.cli import main


def test_in_process_pregenerate_uses_the_services_torch_threads(
        tmp_path: Path, shapes_recipes_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    monkeypatch.setenv("GENAUG_MODEL", "tiny-random")
    argv = ["pregenerate", "--recipes", str(shapes_recipes_file), "--recipe", "shapes",
            "--pool-path", str(tmp_path / "pool.db")]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        torch.set_num_threads(3)
        monkeypatch.setenv("GENAUG_TORCH_THREADS", "1")
        assert main([*argv, "--per-label", "1"]) == 0
        assert torch.get_num_threads() == 1  # the setting
        torch.set_num_threads(max(2, (cores or 1) + 1))  # anything but the default's count
        monkeypatch.delenv("GENAUG_TORCH_THREADS")
        assert main([*argv, "--per-label", "2"]) == 0
        assert torch.get_num_threads() == max(1, (cores or 1) - 1)  # all cores but one
    finally:
        torch.set_num_threads(before)
