"""Keeping the trainer off the generator's GPU: the matching of the service's identity to a
local GPU, on fake NVML tables (no GPU, no TensorFlow in this process)."""

from __future__ import annotations

from typing import Any

import pytest

from genaug.trainer.hardware import devices
from genaug.trainer.hardware.devices import (
    DeviceError,
    GpuInfo,
    ServiceDevice,
    cuda_order,
    match_service_gpu,
    normalize_pci_bus_id,
    normalize_uuid,
    service_device,
    tensorflow_sees_service_gpu,
    visible_after_hiding,
)

# Five RTX 4090s, as in the incident that started genaug; NVML lists them in PCI order.
TABLE = [
    GpuInfo(i, f"GPU-{i}aaaaaaa-1111-2222-3333-44444444444{i}", f"00000000:{bus}:00.0",
            "NVIDIA GeForce RTX 4090")
    for i, bus in enumerate(["1A", "3B", "5E", "86", "AF"])
]
MIXED = [
    GpuInfo(0, "GPU-aaaa", "00000000:01:00.0", "NVIDIA A100"),
    GpuInfo(1, "GPU-bbbb", "00000000:02:00.0", "NVIDIA H100"),
]


def info(uuid: str | None = None, pci: str | None = None, kind: str = "cuda") -> dict[str, Any]:
    return {"device": {"name": f"{kind}:0", "type": kind, "cuda_uuid": uuid, "pci_bus_id": pci}}


def test_identities_are_normalized() -> None:
    assert normalize_uuid("GPU-3B1F-AA") == "3b1f-aa" == normalize_uuid("3b1f-aa")
    assert normalize_pci_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalize_pci_bus_id("0000:3b:00.0") == "0000:3b:00.0"
    assert normalize_pci_bus_id("3B:00.0") == "0000:3b:00.0"
    assert normalize_uuid(None) is None and normalize_pci_bus_id("") is None


def test_service_gpu_is_found_by_uuid_or_local_pci_bus_id() -> None:
    by_uuid = ServiceDevice("cuda", cuda_uuid="gpu-0AAAAAAA-1111-2222-3333-444444444440")
    assert match_service_gpu(TABLE, by_uuid) == TABLE[0]
    by_pci = ServiceDevice("cuda", pci_bus_id="0000:5e:00.0", local=True)
    assert match_service_gpu(TABLE, by_pci) == TABLE[2]
    # a PCI slot names a GPU only on one machine: a remote service's is not ours
    assert match_service_gpu(TABLE, ServiceDevice("cuda", pci_bus_id="0000:5e:00.0",
                                                  local=False)) is None
    # a UUID decides: a remote GPU in the same slot is not matched by its slot
    assert match_service_gpu(TABLE, ServiceDevice("cuda", cuda_uuid="GPU-remote",
                                                  pci_bus_id="0000:1a:00.0")) is None
    assert match_service_gpu(TABLE, ServiceDevice("cpu")) is None


def test_hiding_the_service_gpu_keeps_the_others_by_uuid() -> None:
    visible = visible_after_hiding(TABLE, TABLE[0], {})
    assert visible.split(",") == [g.uuid for g in TABLE[1:]]
    # an existing selection is respected (indices count in PCI order for one GPU model)
    assert visible_after_hiding(TABLE, TABLE[0], {"CUDA_VISIBLE_DEVICES": "0,2"}) == TABLE[2].uuid
    assert visible_after_hiding(TABLE, TABLE[3], {"CUDA_VISIBLE_DEVICES": "1,2"}).split(",") == [
        TABLE[1].uuid, TABLE[2].uuid]
    # UUID prefixes, in the order given
    env = {"CUDA_VISIBLE_DEVICES": "GPU-4aaa,GPU-1aaa,GPU-0aaa"}
    assert visible_after_hiding(TABLE, TABLE[0], env).split(",") == [TABLE[4].uuid, TABLE[1].uuid]
    # only the service's GPU visible: nothing left
    assert visible_after_hiding(TABLE, TABLE[0], {"CUDA_VISIBLE_DEVICES": "0"}) == ""


def test_cuda_order_follows_cuda_rules() -> None:
    assert cuda_order(TABLE, {"CUDA_VISIBLE_DEVICES": "3,9,1"}) == [TABLE[3]]  # stops at 9
    assert cuda_order(TABLE, {"CUDA_VISIBLE_DEVICES": ""}) == []
    assert cuda_order(TABLE, {"CUDA_VISIBLE_DEVICES": "GPU-,0"}) == []  # ambiguous prefix
    # mixed models: "fastest first" is unknown to NVML unless PCI order is asked for
    assert cuda_order(MIXED, {}) is None
    assert cuda_order(MIXED, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}) == MIXED
    assert cuda_order(MIXED, {"CUDA_VISIBLE_DEVICES": "GPU-bbbb"}) == [MIXED[1]]
    with pytest.raises(DeviceError, match="CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        visible_after_hiding(MIXED, MIXED[0], {"CUDA_VISIBLE_DEVICES": "1,0"})


def test_service_device_reads_the_info_group_and_the_old_string() -> None:
    d = service_device(info("GPU-x", "0000:01:00.0"), "http://127.0.0.1:8000")
    assert d.on_cuda and d.cuda_uuid == "GPU-x" and d.local
    assert not service_device({"device": "cpu"}).on_cuda
    old = service_device({"device": "cuda:0"}, "http://gen-host.invalid:8000")
    assert old.on_cuda and old.cuda_uuid is None and not old.local


def test_tensorflow_sees_service_gpu_warns_only_when_it_does() -> None:
    uuid = TABLE[0].uuid
    message = tensorflow_sees_service_gpu(info(uuid), "http://127.0.0.1:8000", table=TABLE,
                                          environ={}, visible_indices=[0, 1, 2, 3, 4])
    assert message is not None and "configure_devices(service_url=" in message
    assert uuid in message
    # GPU 0 hidden by CUDA_VISIBLE_DEVICES, or by set_visible_devices: no warning
    hidden_env = {"CUDA_VISIBLE_DEVICES": visible_after_hiding(TABLE, TABLE[0], {})}
    assert tensorflow_sees_service_gpu(info(uuid), table=TABLE, environ=hidden_env,
                                       visible_indices=[0, 1, 2, 3]) is None
    assert tensorflow_sees_service_gpu(info(uuid), table=TABLE, environ={},
                                       visible_indices=[1, 2, 3, 4]) is None
    # the service on the CPU, or on another machine: nothing to warn about
    assert tensorflow_sees_service_gpu(info(kind="cpu"), table=TABLE, environ={},
                                       visible_indices=[0]) is None
    assert tensorflow_sees_service_gpu(info("GPU-elsewhere"), table=TABLE, environ={},
                                       visible_indices=[0]) is None
    # mixed models with index lists: cannot tell, says so
    unsure = tensorflow_sees_service_gpu(info("GPU-aaaa"), table=MIXED, environ={},
                                         visible_indices=[0])
    assert unsure is not None and "cannot" in unsure


@pytest.fixture
def fake_host(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """This machine has TABLE's GPUs; the service answers with ``state['device']``."""
    state: dict[str, Any] = {"device": ServiceDevice("cuda", cuda_uuid=TABLE[0].uuid)}
    monkeypatch.setattr(devices, "nvml_gpus", lambda: list(TABLE))
    monkeypatch.setattr(devices, "_fetch_service_device", lambda url: state["device"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    return state


def test_hide_sets_cuda_visible_devices_before_tensorflow(
    fake_host: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    said = devices._hide_service_gpu("http://127.0.0.1:8000", explicit_gpus=False)
    assert "hid GPU 0" in said and TABLE[0].uuid in said
    assert os.environ["CUDA_VISIBLE_DEVICES"].split(",") == [g.uuid for g in TABLE[1:]]

    fake_host["device"] = ServiceDevice("cpu", name="cpu")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "untouched")
    assert "no GPU to hide" in devices._hide_service_gpu("http://x", explicit_gpus=False)
    fake_host["device"] = ServiceDevice("cuda", cuda_uuid="GPU-remote", local=False)
    assert "another host" in devices._hide_service_gpu("http://x", explicit_gpus=False)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "untouched"


def test_unknown_identity_or_no_nvml_is_an_error_unless_gpus_are_explicit(
    fake_host: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_host["device"] = ServiceDevice("cuda", name="cuda:0")  # an old service
    with pytest.raises(DeviceError, match="does not report its GPU's identity"):
        devices._hide_service_gpu("http://127.0.0.1:1", explicit_gpus=False)
    assert "nothing hidden" in devices._hide_service_gpu("http://127.0.0.1:1", explicit_gpus=True)
    fake_host["device"] = ServiceDevice("cuda", cuda_uuid=TABLE[0].uuid)
    monkeypatch.setattr(devices, "nvml_gpus", lambda: None)
    with pytest.raises(DeviceError, match="nvidia-ml-py"):
        devices._hide_service_gpu("http://127.0.0.1:1", explicit_gpus=False)


def test_configure_devices_refuses_once_tensorflow_has_its_gpus(
    fake_host: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(devices, "_tf_gpus_initialized", lambda: True)
    with pytest.raises(DeviceError, match="after TensorFlow initialised its GPUs"):
        devices.configure_devices(service_url="http://127.0.0.1:8000")


def test_a_live_cpu_service_hides_nothing(service: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "kept")
    said = devices._hide_service_gpu(service.url, explicit_gpus=False)
    assert "runs on cpu" in said and "no GPU to hide" in said
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "kept"


@pytest.mark.gpu
def test_torch_identity_of_a_cuda_device_is_found_by_nvml() -> None:
    """The torch side: what a CUDA service reports (torch's UUID and PCI location) is the GPU
    NVML lists, so the trainer hides the right one."""
    import torch

    table = devices.nvml_gpus()
    assert table, "NVML lists no GPU on a machine where torch sees CUDA"
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        uuid = f"GPU-{props.uuid}"
        pci = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        by_uuid = match_service_gpu(table, ServiceDevice("cuda", cuda_uuid=uuid))
        by_pci = match_service_gpu(table, ServiceDevice("cuda", pci_bus_id=pci))
        assert by_uuid is not None and by_uuid == by_pci, (uuid, pci, table)
