"""python -m bench.gain.augmentation_gain --quick and genaug demo run end to end (CI size).

Both start ``genaug serve`` (the embedded tiny-digits generator) as a child process; the
benchmark also starts the TensorFlow child that trains the few-shot CNN under
MirroredStrategy with the reservoir and feeder. Neither torch's pipeline nor TensorFlow loads
in the pytest process. The figures here are not the benchmark's (1 seed, 120 steps): the test
checks that every arm ran through the real path and that the numbers are sane.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.timeout(1800)  # a service, a pool fill and 4 TensorFlow runs; minutes on 2 cores
def test_quick_benchmark_runs_every_available_arm(tmp_path: Path) -> None:
    if not all(importlib.util.find_spec(m) for m in ("tensorflow", "sklearn")):
        pytest.skip("needs tensorflow and scikit-learn (pip install 'genaug[dev,trainer]')")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gain.augmentation_gain", "--quick", "--out",
         str(tmp_path)], capture_output=True, text=True, timeout=1500, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    arms = result["arms"]
    assert {"1 real only", "2 + text-to-image p=0.5", "4 synthetic only"} <= arms.keys()
    for arm in arms.values():
        assert 0.0 <= arm["mean"] <= 1.0 and len(arm["runs"]) == 1
    # Well above chance (0.1) even at CI size: the real path learned something.
    assert arms["1 real only"]["mean"] > 0.2
    assert arms["4 synthetic only"]["mean"] > 0.2
    mixing = [run for run in result["runs"] if run["p"] > 0]
    real_only = [run for run in result["runs"] if run["p"] == 0]
    assert mixing and real_only, result["runs"]  # both kinds ran, so both checks below ran
    for run in mixing:
        assert run["feeder"] > 0 and min(run["reservoir_fill"]) > 0
        assert run["mixed_fraction"] > 0.3 * run["p"]
    assert all(run["mixed_fraction"] == 0.0 for run in real_only)
    assert result["fidelity"]["images"] >= 80 and result["fidelity"]["share"] > 0.5
    assert (tmp_path / "grid.png").read_bytes().startswith(b"\x89PNG")
    # arm 3 through the pool: recipe labels with `images:` folders, variants made by
    # pre-generation (the fallbacks in the script are for a service without those fields)
    assert result["arm3"] == "ran from recipe image folders through the pool", result["arm3"]
    assert "3 + img2img variants p=0.5" in arms
    assert "fidelity:" in proc.stdout and "pts" in proc.stdout


@pytest.mark.timeout(1200)
def test_demo_without_training_writes_the_digit_grid(tmp_path: Path) -> None:
    if importlib.util.find_spec("sklearn") is None:
        pytest.skip("needs scikit-learn")
    from PIL import Image

    out = tmp_path / "demo.png"
    proc = subprocess.run([sys.executable, "-m", "genaug.cli", "demo", "--no-train", "--out",
                           str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "tiny-digits" in proc.stdout and "10 digits x 4 images" in proc.stdout
    assert "real digits and their img2img variants" in proc.stdout
    assert "the pool of 'digits' holds" in proc.stdout
    with Image.open(out) as grid:
        # one labelled rectangle: a column of 128 px tiles per digit; 4 generated rows, real,
        # variants
        assert grid.width >= 10 * 128 and 6 * 128 <= grid.height < 7 * 128
        assert grid.getpixel((grid.width - 64, grid.height - 64)) != (255, 255, 255)


@pytest.mark.timeout(1200)
def test_the_readme_demo_end_to_end_feeds_the_mixing_run(tmp_path: Path) -> None:
    """``make demo``'s command as the README runs it, training included: both runs train, and
    the mixing run is really fed from the pool (its arm's name, with spaces and '=', once made
    an X-Client-Id the service refused, and the run fed 0 images while reporting success)."""
    import re

    out = tmp_path / "demo.png"
    proc = subprocess.run([sys.executable, "-m", "genaug.cli", "demo", "--out", str(out)],
                          capture_output=True, text=True, timeout=1100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    fed = re.search(r"\((\d+)% of examples synthetic, (\d+) images fed\)", proc.stdout)
    assert fed is not None, proc.stdout[-3000:]
    assert int(fed.group(1)) >= 20 and int(fed.group(2)) >= 160, fed.group(0)  # 16 per digit
    assert re.search(r"real only .*\s0\.\d{3}\n", proc.stdout) and out.is_file()


@pytest.mark.timeout(1800)  # a LoRA, a service, 6 pools, 11 TensorFlow runs, then a resume
def test_quick_honest_protocol_runs_every_arm_with_the_judge_and_resumes(tmp_path: Path) -> None:
    """python -m bench.gain.honest_gain --quick: the few-shot protocol end to end at k = 1
    (1 seed, a 60-step LoRA), the judged arms included; then the same command again resumes
    from its work folder (nothing retrained). Checks the path and the bookkeeping, not the
    figures."""
    if not all(importlib.util.find_spec(m) for m in ("tensorflow", "sklearn", "scipy")):
        pytest.skip("needs tensorflow, scikit-learn and scipy")
    work = tmp_path / "work"
    cmd = [sys.executable, "-m", "bench.gain.honest_gain", "--quick", "--workdir", str(work),
           "--json", str(tmp_path / "result.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    k1 = result["k"]["1"]
    rows = k1["rows"]
    kinds = ("2 base img2img", "3 LoRA text-to-image", "4 LoRA img2img",
             "2j base img2img + judge", "3j LoRA text-to-image + judge",
             "4j LoRA img2img + judge", "4a LoRA img2img + judge, speed auto")
    names = {name.removesuffix(" *") for name in rows}
    for name in ("1 real only, k=1", *kinds, "ref: real only, k=2", "ref: real only, k=4",
                 "ref: a perfect generator's pool (real 5-9 it never trained on)",
                 "ref: ceiling, all real 5-9"):
        assert name in names, (name, sorted(rows))
    assert any(name.startswith("5 ") and "need-allocated" in name for name in rows), rows
    # The best arm is named (on k = 1's own validation: k = 5 did not run) and marked.
    assert k1["best"] is not None and "provisional" in k1["best_chosen"]
    assert sum(name.endswith(" *") for name in rows) == 1
    for row in rows.values():
        assert all(0.0 <= a <= 1.0 for a in row["test"] + row["validation"])
    # The judged pools were judged: every stored image scored, and what the pool counts as
    # its fill is what the judge accepted (or its label stopped).
    pools = k1["pools"]
    for kind in ("base-var-j", "lora-t2i-j", "lora-var-j", "lora-var-j-auto"):
        pool = pools[f"{kind}-k1-s0"]
        for lb, (judged, accepted) in pool["judged"].items():
            assert judged is not None and judged >= accepted >= pool["fill"][lb], (kind, pool)
            assert accepted >= pool["target"][lb] or lb in pool["stopped"], (kind, pool)
    for kind in ("base-var", "lora-t2i", "lora-var"):  # unjudged: nothing scored
        assert all(j in (None, 0) for j, _ in pools[f"{kind}-k1-s0"]["judged"].values())
    # The auto pool trained on what its decision drew: it had decided before its row ran.
    assert pools["lora-var-j-auto-k1-s0"]["sampling"]["state"] == "decided"
    mixing = [run for run in result["runs"] if run["p"] > 0 and run["recipe"] is not None]
    assert len(mixing) == 8, [run["key"] for run in result["runs"]]
    # k real shots per class beside the pool, as row 1 has (they once had FewShotRun's 5)
    assert all(run["per_class"] == 1 and run["train_images"] == 5 for run in mixing)
    assert all(run["feeder"] > 0 and max(run["reservoir_fill"]) > 0 for run in mixing)
    # The perfect generator's pool: real generator-split digits, the same slots, no service.
    perfect = [run for run in result["runs"] if run["reservoir_split"] is not None]
    assert [run["key"] for run in perfect] == ["perfect-k1-s0"]
    assert perfect[0]["reservoir_fill"] == [4] * 5 and perfect[0]["feeder"] == 0
    assert perfect[0]["mixed_fraction"] > 0.3
    assert (work / "lora-k1-s0.safetensors").exists()
    assert "k = 1: the best arm" in proc.stdout
    # Resume: the second run trains nothing and adapts nothing; the table is the same.
    lines = (work / "rows.jsonl").read_text().splitlines()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
    assert (work / "rows.jsonl").read_text().splitlines() == lines
    assert "adapted in" not in again.stdout
    assert json.loads((tmp_path / "result.json").read_text())["k"]["1"]["rows"] == rows
    report = subprocess.run([*cmd, "--report"], capture_output=True, text=True, timeout=300,
                            cwd=ROOT)
    assert report.returncode == 0, report.stdout[-4000:] + report.stderr[-4000:]
    assert "k = 1: digits 5-9" in report.stdout and "2j base img2img + judge" in report.stdout
    assert json.loads((tmp_path / "result.json").read_text())["k"]["1"]["rows"] == rows


@pytest.mark.timeout(1800)  # a LoRA, a service, 6 pools, 11 PyTorch runs
def test_quick_honest_protocol_through_pytorch(tmp_path: Path) -> None:
    """python -m bench.gain.honest_gain --quick --trainer torch: the same protocol with every
    row trained by the PyTorch child (genaug.torch's MixedDataset in a DataLoader of 2
    workers), TensorFlow never imported; the rows say their trainer, the generated ones train
    on k real shots beside their pool, really fed from it."""
    if not all(importlib.util.find_spec(m) for m in ("torch", "sklearn", "scipy")):
        pytest.skip("needs torch, scikit-learn and scipy")
    work = tmp_path / "work"
    cmd = [sys.executable, "-m", "bench.gain.honest_gain", "--quick", "--trainer", "torch",
           "--workdir", str(work), "--json", str(tmp_path / "result.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["trainer"] == "torch"
    runs = result["runs"]
    assert runs and all(run["trainer"] == "torch" for run in runs)
    assert len(result["k"]["1"]["rows"]) == 13, sorted(result["k"]["1"]["rows"])
    mixing = [run for run in runs if run["p"] > 0 and run["recipe"] is not None]
    assert len(mixing) == 8, [run["key"] for run in runs]
    assert all(run["per_class"] == 1 and run["train_images"] == 5 for run in mixing)
    assert all(run["feeder"] > 0 and max(run["reservoir_fill"]) > 0 for run in mixing)
    assert all(run["mixed_fraction"] > 0.1 for run in mixing), mixing
    assert "k = 1: the best arm" in proc.stdout
    # The folder is torch's: the TensorFlow protocol refuses it, naming the fix.
    refused = subprocess.run([*cmd[:4], "--workdir", str(work), "--report"],
                             capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert refused.returncode != 0 and "trained by torch, not tensorflow" in refused.stderr
