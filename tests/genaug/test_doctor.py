"""``genaug doctor`` against a live service (ready, wrong key, unknown recipe, service down),
and its host checks with fake device tables and environments.

The live tests use real services in this process (:mod:`genaug.service.testing`) and the
doctor's own code path; the host is a fake :class:`~genaug.trainer.hardware.host.Host` so that the
answers do not depend on this machine's GPUs, CUDA or memory. One test runs
``genaug doctor`` (``python -m genaug.cli doctor``) for real, on this machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from genaug import __version__
from genaug.doctor import Options, add_arguments, check_pool, format_checks, run
from genaug.local_service import free_port
from genaug.service.testing import LiveService, start_service
from genaug.trainer.hardware.devices import GpuInfo
from genaug.trainer.hardware.host import (
    LIBDEVICE,
    Check,
    Host,
    check_gpus,
    check_memory,
    check_xla,
)
from genaug.trainer.hardware.versions import check_torch_versions, check_versions

if TYPE_CHECKING:
    from genaug.service.pipeline.load import LoadedModel

KEY = "doctor-key"
GB = 10**9
CLEAN_HOST = Host(environ={}, gpu_table=None, build_info={"is_cuda_build": False},
                  packages={"tensorflow": "2.21.0", "keras": "3.15.1", "torch": "2.13.0"},
                  available_memory=16 * GB)
"""A CPU training host with everything in place."""


@pytest.fixture(scope="module")
def keyed(tiny_model: LoadedModel, tmp_path_factory: pytest.TempPathFactory,
          shapes_recipe: str) -> Iterator[LiveService]:
    """A service with an API key and the recipe ``shapes``, its pool filled to 2 per label."""
    folder = tmp_path_factory.mktemp("doctor")
    (folder / "recipes.yaml").write_text(shapes_recipe)
    live = start_service(tiny_model, api_keys=[KEY], recipes=folder / "recipes.yaml",
                         pool_path=folder / "pool.db", pregenerate=False,
                         pool_capacity_per_label=4, max_batch_images=8)
    from genaug.client import Client

    with Client(live.url, api_key=KEY) as client:
        client.fill("shapes", per_label=2)
        live.wait_until(lambda: min(client.recipe("shapes")["fill"].values()) >= 2,
                        timeout=60, what="the shapes pool filled to 2 per label")
    yield live
    live.stop()


def doctor(*argv: str, host: Host = CLEAN_HOST) -> tuple[int, str, float]:
    """Run the doctor's command on ``argv``; (exit status, what it printed, seconds)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out: list[str] = []
    t0 = time.perf_counter()
    code = run(parser.parse_args(list(argv)), host=host, write=out.append)
    return code, "".join(out), time.perf_counter() - t0


def line(text: str, name: str) -> str:
    """The line of check ``name`` and, when there is one, its fix line."""
    lines = text.splitlines()
    for i, ln in enumerate(lines):
        if ln[6:].startswith(f"{name} "):
            fix = lines[i + 1] if i + 1 < len(lines) and "fix: " in lines[i + 1] else ""
            return ln + ("\n" + fix if fix else "")
    raise AssertionError(f"no {name} check in:\n{text}")


# ----------------------------------------------------------------------------- live


def test_ready_service_and_full_pool_exit_0(keyed: LiveService) -> None:
    code, text, took = doctor("--url", keyed.url, "--recipe", "shapes", "--api-key", KEY,
                              "--slots-per-class", "2")
    assert code == 0, text
    assert line(text, "service").startswith(f"ok    service   genaug {__version__} at "
                                            f"{keyed.url} is ready (")
    assert "requires a key and accepts the one sent (--api-key)" in line(text, "api-key")
    assert "tiny-random from tiny-random" in line(text, "model")
    assert "float32 on cpu" in line(text, "model")
    assert ("'shapes': 3 labels ['circle', 'square', 'triangle'], 32x32x3 images"
            in line(text, "recipe"))
    assert line(text, "pool").startswith(
        "ok    pool      pool of 'shapes': circle 2, square 2, triangle 2")
    assert line(text, "pool").endswith(": full")
    assert "the service runs on cpu: no GPU to keep apart" in line(text, "gpus")
    assert "the reservoir for 3 labels x 2 slots of 32x32x3" in line(text, "memory")
    assert text.rstrip().endswith("0 failed, 0 warning(s), 9 ok")
    assert "fix:" not in text
    assert took < 5.0  # the goal: an answer within 5 s against a running service


def test_json_lists_every_check(keyed: LiveService) -> None:
    code, text, _ = doctor("--url", keyed.url, "--recipe", "shapes", "--api-key", KEY,
                           "--slots-per-class", "4", "--json")
    checks = json.loads(text)["checks"]
    assert code == 0
    assert [c["name"] for c in checks] == ["service", "api-key", "model", "recipe", "pool",
                                           "gpus", "xla", "versions", "memory"]
    assert all(set(c) == {"name", "status", "message", "fix"} for c in checks)
    pool = checks[4]  # 2 of the 4 slots filled, and nothing more planned: a warning, exit 0
    assert pool["status"] == "warn" and "nothing more is being generated" in pool["message"]
    assert pool["fix"] == (f"genaug pregenerate --recipe shapes --per-label 4 --url "
                           f"{keyed.url}")


def test_wrong_key_fails_with_the_fix(keyed: LiveService) -> None:
    code, text, _ = doctor("--url", keyed.url, "--recipe", "shapes", "--api-key", "wrong")
    assert code == 1
    assert line(text, "service").startswith("ok    service   a genaug service at")  # /readyz
    key = line(text, "api-key")
    assert key.startswith("fail  api-key   401 from ")
    assert "the API key sent is not one of this service's keys" in key
    assert "(sent: --api-key)" in key
    assert "fix: set GENAUG_API_KEY (or --api-key) to one of the service's keys" in key
    assert "recipe" not in [ln[6:14].strip() for ln in text.splitlines()]


def test_missing_key_fails(keyed: LiveService, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GENAUG_API_KEY", raising=False)
    code, text, _ = doctor("--url", keyed.url)
    assert code == 1
    assert "this service requires an API key" in line(text, "api-key")
    assert "(sent: no key)" in line(text, "api-key")


def test_unknown_recipe_fails_naming_the_known_ones(keyed: LiveService) -> None:
    code, text, _ = doctor("--url", keyed.url, "--recipe", "shapez", "--api-key", KEY)
    assert code == 1
    recipe = line(text, "recipe")
    assert recipe.startswith("fail  recipe    the service has no recipe 'shapez'; it has "
                             "['shapes']")
    assert "fix: pass one of ['shapes'] with --recipe, or add 'shapez' to the" in recipe
    assert "not sized (recipe 'shapez' not found)" in line(text, "memory")
    assert text.rstrip().endswith("1 failed, 0 warning(s), 7 ok")


def test_service_without_key_or_recipes(service: LiveService,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GENAUG_API_KEY", raising=False)
    code, text, _ = doctor("--url", service.url)
    assert code == 0
    assert "the service requires no key" in line(text, "api-key")
    recipe = line(text, "recipe")
    assert recipe.startswith("warn  recipe    the service has no recipes")
    assert "fix: genaug serve --recipes FILE" in recipe


def test_service_down_fails_fast() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    code, text, took = doctor("--url", url)
    assert code == 1
    service = line(text, "service")
    assert service.startswith(f"fail  service   no genaug service answers at {url} (")
    assert "fix: start it (genaug serve --port N) or point at it: --url URL / GENAUG_URL" \
        in service
    names = [ln[6:14].strip() for ln in text.splitlines() if not ln.startswith(" ")]
    assert names[:-1] == ["service", "xla", "versions", "memory"]  # the host is still checked
    assert took < 5.0


def test_genaug_doctor_command_on_this_machine(keyed: LiveService) -> None:
    """The real command: a fresh interpreter, this machine's NVML, TensorFlow files, memory.
    No TensorFlow import: the answer comes well within 5 s."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "genaug.cli", "doctor", "--url", keyed.url, "--api-key", KEY,
         "--recipe", "shapes", "--json"],
        capture_output=True, text=True, timeout=60)
    took = time.perf_counter() - t0
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert proc.returncode == (1 if any(c["status"] == "fail" for c in checks.values()) else 0)
    assert checks["service"]["status"] == "ok" and checks["recipe"]["status"] == "ok"
    assert "tensorflow" not in proc.stderr.lower()  # nothing started TensorFlow
    print(f"\ngenaug doctor answered in {took:.2f} s")


# ----------------------------------------------------------------------------- gpus (NVML)

A = GpuInfo(0, "GPU-aaaa1111-0000-0000-0000-000000000000", "00000000:01:00.0", "RTX 4090")
B = GpuInfo(1, "GPU-bbbb2222-0000-0000-0000-000000000000", "00000000:02:00.0", "RTX 4090")
C = GpuInfo(2, "GPU-cccc3333-0000-0000-0000-000000000000", "00000000:03:00.0", "RTX 3060")
URL = "http://127.0.0.1:8000"


def on_gpu(gpu: GpuInfo | None = A, **device: Any) -> dict[str, Any]:
    """A ``/v1/info`` answer of a service running on ``gpu``."""
    if gpu is not None:
        device = {"cuda_uuid": gpu.uuid, "pci_bus_id": gpu.pci_bus_id, **device}
    return {"device": {"type": "cuda", "name": "cuda:0", **device}}


def gpus(info: dict[str, Any], table: list[GpuInfo] | None, url: str = URL,
         **environ: str) -> Check:
    return check_gpus(info, url, Host(environ=environ, gpu_table=table))


def test_gpus_tensorflow_would_use_the_generators_gpu() -> None:
    """Seed 000: GPU 0 runs the generator and CUDA_VISIBLE_DEVICES is unset."""
    check = gpus(on_gpu(A), [A, B])
    assert check.status == "warn"
    assert check.message.startswith("TensorFlow would use GPU 0 (RTX 4090) too "
                                    "(CUDA_VISIBLE_DEVICES unset)")
    assert check.fix.startswith(f"export CUDA_VISIBLE_DEVICES={B.uuid} before training")
    assert "configure_devices(service_url=...)" in check.fix


def test_gpus_hidden_by_index_is_ok() -> None:
    check = gpus(on_gpu(A), [A, B], CUDA_VISIBLE_DEVICES="1")
    assert check.status == "ok"
    assert "TensorFlow would not see it (CUDA_VISIBLE_DEVICES '1')" in check.message
    assert "TensorFlow would use GPU 1 (GPU-bbbb2222)" in check.message


def test_gpus_only_the_generators_gpu_visible() -> None:
    check = gpus(on_gpu(A), [A, B], CUDA_VISIBLE_DEVICES=A.uuid)
    assert check.status == "warn"
    assert "no other GPU is left for TensorFlow" in check.message
    assert check.fix.startswith('export CUDA_VISIBLE_DEVICES="" before training')


def test_gpus_found_by_pci_bus_id_when_no_uuid() -> None:
    info = on_gpu(None, pci_bus_id="0000:02:00.0")
    check = gpus(info, [A, B], CUDA_VISIBLE_DEVICES="0,1")
    assert check.status == "warn" and "GPU 1" in check.message
    assert check.fix.startswith(f"export CUDA_VISIBLE_DEVICES={A.uuid} ")


def test_gpus_mixed_models_with_indices_cannot_be_told() -> None:
    check = gpus(on_gpu(C), [A, C], CUDA_VISIBLE_DEVICES="0")
    assert check.status == "warn" and "fastest-first" in check.message
    assert check.fix.startswith("export CUDA_DEVICE_ORDER=PCI_BUS_ID")
    assert gpus(on_gpu(C), [A, C], CUDA_VISIBLE_DEVICES="0",
                CUDA_DEVICE_ORDER="PCI_BUS_ID").status == "ok"


def test_gpus_without_nvml() -> None:
    check = gpus(on_gpu(A), None)
    assert check.status == "warn" and "NVML is not available" in check.message
    assert "pip install nvidia-ml-py" in check.fix
    remote = gpus(on_gpu(A), None, url="http://gpu-box.example:8000")
    assert remote.status == "ok" and "another host" in remote.message


def test_gpus_service_elsewhere_or_on_cpu() -> None:
    other = GpuInfo(0, "GPU-dddd4444-0000-0000-0000-000000000000", "00000000:01:00.0")
    check = gpus(on_gpu(other), [A, B], url="http://gpu-box.example:8000")
    assert check.status == "ok" and "is on another host" in check.message
    assert "TensorFlow would use GPU 0 (GPU-aaaa1111), GPU 1 (GPU-bbbb2222)" in check.message
    cpu = gpus({"device": {"type": "cpu", "name": "cpu"}}, [A])
    assert cpu.status == "ok" and cpu.message.startswith("the service runs on cpu")


def test_gpus_service_without_identity() -> None:
    check = gpus({"device": {"type": "cuda", "name": "cuda:0"}}, [A, B])
    assert check.status == "warn" and "does not say which GPU" in check.message


# ----------------------------------------------------------------------------- xla


CUDA_BUILD = {"is_cuda_build": True, "cuda_version": "12.5.1"}


def cuda_root(folder: Path) -> Path:
    (folder / LIBDEVICE).parent.mkdir(parents=True)
    (folder / LIBDEVICE).write_bytes(b"BC")
    return folder


def xla(tmp_path: Path, *, build: dict[str, Any] | None = CUDA_BUILD,
        table: list[GpuInfo] | None = None, roots: tuple[Path, ...] = (),
        hints: tuple[Path, ...] = (), **environ: str) -> Check:
    return check_xla(Host(environ=environ, gpu_table=[A] if table is None else table,
                          build_info=build, cuda_roots=roots or (tmp_path / "nowhere",),
                          cuda_hints=hints))


def test_xla_flags_pointing_at_libdevice_is_ok(tmp_path: Path) -> None:
    root = cuda_root(tmp_path / "cuda-12.5")
    check = xla(tmp_path, XLA_FLAGS=f"--xla_gpu_cuda_data_dir={root} --xla_dump_to=/tmp/x")
    assert check.status == "ok" and str(root) in check.message


def test_xla_flags_pointing_at_a_folder_without_libdevice(tmp_path: Path) -> None:
    """Seed 003: 'libdevice not found at ./libdevice.10.bc'."""
    real = cuda_root(tmp_path / "cuda-12.5")
    check = xla(tmp_path, hints=(real,), XLA_FLAGS=f"--xla_gpu_cuda_data_dir={tmp_path}/cuda")
    assert check.status == "fail"
    assert f"{tmp_path}/cuda/nvvm/libdevice/libdevice.10.bc does not exist" in check.message
    assert check.fix == f"export XLA_FLAGS=--xla_gpu_cuda_data_dir={real}"


def test_xla_libdevice_only_where_xla_does_not_look(tmp_path: Path) -> None:
    real = cuda_root(tmp_path / "opt-cuda")
    check = xla(tmp_path, hints=(real,))
    assert check.status == "fail" and "where XLA does not look" in check.message
    assert check.fix == f"export XLA_FLAGS=--xla_gpu_cuda_data_dir={real}"


def test_xla_libdevice_where_xla_looks(tmp_path: Path) -> None:
    root = cuda_root(tmp_path / "site-packages" / "nvidia" / "cuda_nvcc")
    check = xla(tmp_path, roots=(tmp_path / "usr-local-cuda", root))
    assert check.status == "ok" and "without XLA_FLAGS" in check.message


def test_xla_no_libdevice_anywhere(tmp_path: Path) -> None:
    check = xla(tmp_path)
    assert check.status == "fail"
    assert "TensorFlow is a CUDA 12.5.1 build and no nvvm/libdevice/libdevice.10.bc" \
        in check.message
    assert check.fix.startswith("pip install nvidia-cuda-nvcc-cu12 (or tensorflow[and-cuda])")
    assert "jit_compile=False" in check.fix
    assert xla(tmp_path, table=[]).status == "warn"  # no GPU here: only a warning


def test_xla_cpu_build_or_no_tensorflow(tmp_path: Path) -> None:
    assert xla(tmp_path, build={"is_cuda_build": False}).status == "ok"
    check = xla(tmp_path, build=None)
    assert check.status == "ok" and "not installed" in check.message


# ----------------------------------------------------------------------------- versions


def versions(*, tf: str | None = "2.21.0", keras: str | None = "3.15.1",
             driver_cuda: int | None = None, service: str | None = None) -> Check:
    return check_versions(Host(packages={"tensorflow": tf, "keras": keras},
                               gpu_table=[A], driver="550.54.15" if driver_cuda else None,
                               driver_cuda=driver_cuda, build_info=CUDA_BUILD), service)


def test_versions_ok_and_reported() -> None:
    check = versions(driver_cuda=12060, service=__version__)
    assert check.status == "ok"
    assert check.message == (f"TensorFlow 2.21.0, Keras 3.15.1, NVIDIA driver 550.54.15 "
                             f"(CUDA 12.6), TensorFlow built for CUDA 12.5, genaug "
                             f"{__version__} here, {__version__} at the service")


def test_versions_failures() -> None:
    assert versions(tf=None).fix == "pip install 'genaug[trainer]'"
    assert versions(keras="2.15.0").status == "fail"
    old = versions(driver_cuda=11080)
    assert old.status == "fail" and "TensorFlow would find no GPU" in old.message
    assert old.fix.startswith("install an NVIDIA driver for CUDA 12.5 or newer")
    assert versions(driver_cuda=12020).status == "warn"
    other = versions(service="0.0.9")
    assert other.status == "warn" and "install genaug 0.0.9 here" in other.fix


def test_a_torch_trainers_versions_name_torch_and_its_cuda() -> None:
    def torch_versions(version: str | None, driver_cuda: int | None = None) -> Check:
        return check_torch_versions(Host(packages={"torch": version}, gpu_table=[A],
                                         driver="550.54.15" if driver_cuda else None,
                                         driver_cuda=driver_cuda), __version__)

    good = torch_versions("2.11.0+cu130", driver_cuda=13000)
    assert good.status == "ok" and good.message.startswith(
        "torch 2.11.0+cu130, NVIDIA driver 550.54.15 (CUDA 13.0), genaug ")
    assert torch_versions("2.13.0").status == "ok"  # a CPU wheel: no CUDA to match
    old = torch_versions("2.11.0+cu130", driver_cuda=12080)
    assert old.status == "fail" and "CUDA 13.0 or newer" in old.fix
    assert torch_versions(None).fix == "pip install 'genaug[torch]'"


def test_genaug_doctor_for_a_torch_trainer_checks_torch_not_tensorflow(
        keyed: LiveService) -> None:
    code, text, _ = doctor("--url", keyed.url, "--recipe", "shapes", "--api-key", KEY,
                           "--slots-per-class", "2", "--trainer", "torch")
    assert code == 0, text
    assert line(text, "versions").startswith("ok    versions  torch 2.")
    assert "xla" not in text and "TensorFlow" not in line(text, "versions")


# ----------------------------------------------------------------------------- memory, pool


DETAIL = {"name": "wounds", "labels": ["I", "P", "R"], "capacity_per_label": 1000,
          "spec": {"height": 1024, "width": 1024, "output_height": 256, "output_width": 256}}


def test_memory_against_the_reservoir() -> None:
    need = 3 * 128 * 256 * 256 * 3  # 75.5 MB
    check = check_memory(DETAIL, 128, Host(available_memory=16 * GB))
    assert check.status == "ok"
    assert check.message == ("the reservoir for 3 labels x 128 slots of 256x256x3 takes "
                             "75.5 MB; 16.00 GB available")
    tight = check_memory(DETAIL, 128, Host(available_memory=int(1.5 * need)))
    assert tight.status == "warn" and tight.fix.startswith("--slots-per-class 96 or less")
    short = check_memory(DETAIL, 128, Host(available_memory=need // 2))
    assert short.status == "fail" and "it does not fit" in short.message
    assert short.fix.startswith("--slots-per-class 32 or less")


def pool(fill: dict[str, int], rate: float, target: int = 128, **kwargs: Any) -> Check:
    detail = {**DETAIL, "fill": fill, "generation_rate": rate,
              "target_per_label": {label: target for label in fill}}
    return check_pool(detail, slots=kwargs.pop("slots", 128), epoch_s=kwargs.pop("epoch_s", None),
                      pregenerate=kwargs.pop("pregenerate", True), url=URL)


def test_pool_full_filling_and_empty() -> None:
    assert pool({"I": 128, "P": 200, "R": 128}, 0.0).message.endswith(": full")
    filling = pool({"I": 128, "P": 64, "R": 8}, 2.0)  # 184 short at 2 images/s: 92 s
    assert filling.status == "warn"
    assert "full in about 2 min (pass --epoch-s" in filling.message
    assert pool({"I": 128, "P": 64, "R": 8}, 2.0, epoch_s=120).status == "ok"
    late = pool({"I": 128, "P": 64, "R": 8}, 2.0, epoch_s=30)
    assert late.status == "warn" and "after the first epoch (30 s) ends" in late.message
    assert late.fix.startswith("fill it before training: genaug pregenerate --recipe wounds "
                               "--per-label 128 --url http://127.0.0.1:8000")
    empty = pool({"I": 0, "P": 0, "R": 0}, 0.0, target=0, pregenerate=False)
    assert empty.status == "warn"
    assert "empty and nothing more is being generated (pre-generation is off)" in empty.message
    some = pool({"I": 12, "P": 0, "R": 3}, 0.0)
    assert "labels ['P'] empty" in some.message
    # Generating, but only up to 32 per label: the rest never comes without a larger target.
    low = pool({"I": 12, "P": 0, "R": 3}, 1.5, target=32)
    assert low.status == "warn" and "plans only 81 of the 369 image(s) missing" in low.message
    assert low.fix.startswith("genaug pregenerate --recipe wounds --per-label 128")


def _stop_reason(label: str, accepted: int, judged: int) -> str:
    """The planner's reason for a stopped label, word for word (a live one is checked in
    tests/service/pool/test_pool_stopped.py)."""
    return (f"stopped: the judge accepted {accepted} of the {judged} images of label "
            f"{label!r} it judged last, before 2026-11-28 09:00 UTC "
            f"({100 * accepted / judged:.0f} %, under 10 %), so "
            "generating more would spend the device on images that are never sampled. Fix: "
            f"give the judge more or better shots (judge.shots: wounds/shots/{label}), train "
            "the label's adapter longer, or lower judge.min_score (now 0.9); then restart the "
            "service")


def test_a_label_the_judge_stopped_gets_the_judges_fix_not_a_fill_that_cannot_end() -> None:
    detail = {**DETAIL, "fill": {"I": 40, "P": 3, "R": 128}, "generation_rate": 1.0,
              "target_per_label": {"I": 128, "P": 128, "R": 128},
              "stopped": {"P": _stop_reason("P", 3, 52), "R": _stop_reason("R", 4, 50)}}
    check = check_pool(detail, slots=128, epoch_s=None, pregenerate=True, url=URL)
    assert check.status == "warn"
    # R is stopped but full: only P is named, with what it holds and why
    assert ("the judge stopped 1 label(s), so no more of their images are made and the "
            "reservoir mixes only what the pool holds of them: P (3 held): the judge accepted "
            "3 of the 52 images of label 'P' it judged last, before 2026-11-28 09:00 UTC (6 %, "
            "under 10 %)"
            ) in check.message, check.message
    assert "'R'" not in check.message
    assert check.fix == (
        "P: give the judge more or better shots (judge.shots: wounds/shots/P), train the "
        "label's adapter longer, or lower judge.min_score (now 0.9); then restart the service; "
        "then fill the pool: genaug pregenerate --recipe wounds --per-label 128 --url "
        "http://127.0.0.1:8000")
    # without the stop the same pool gets the fill
    del detail["stopped"]
    assert check_pool(detail, slots=128, epoch_s=None, pregenerate=True,
                      url=URL).fix.startswith("fill it before training: genaug pregenerate")


def test_format_prints_a_fix_line_under_each_problem() -> None:
    text = format_checks([Check("service", "ok", "ready"),
                          Check("xla", "fail", "no libdevice", "export XLA_FLAGS=...")])
    assert text.splitlines() == [
        "ok    service   ready",
        "fail  xla       no libdevice",
        "                fix: export XLA_FLAGS=...",
        "1 failed, 0 warning(s), 1 ok",
    ]


def test_options_default_to_genaug_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENAUG_URL", "http://10.0.0.5:8000,http://10.0.0.6:8000")
    from genaug.doctor import _default_url

    assert _default_url() == "http://10.0.0.5:8000"
    assert Options().url == "http://127.0.0.1:8000"
