"""What the docker/ tests share about the compose file: which services are generators,
trainers and servers, which profiles run together, the folders a user mounts, and the GPU ids
a service asks for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from _docker_files import CPU_SERVICE

GENERATOR = "generator"
#: Profiles run together as docs/deploy.md runs them: "gpu" is the base of the GPU setups,
#: "second-trainer" and "replicas" are added to it (alternatives: they share GPUs 5-7), and
#: "cpu" runs alone. Every profile of the compose file must appear here.
RUN_TOGETHER = {
    "gpu": ["gpu"],
    "gpu + second-trainer": ["gpu", "second-trainer"],
    "gpu + replicas": ["gpu", "replicas"],
    "cpu": ["cpu"],
    "split": ["split"],
}
#: .env.example's folders of yours, which no repo or image can ship: each must be a bind
#: mount's source; the reason it need not exist in a fresh checkout is beside it.
YOUR_FOLDERS = {
    "GENAUG_MODELS_DIR": "your weights, a placeholder under /srv",
    "GENAUG_TRAIN_DATA": "your training images, a placeholder under /srv",
    "GENAUG_TRAIN_DATA_2": "the same",
    "GENAUG_TRAIN_DATA_R": "the same",
    "GENAUG_RUNS_DIR": "made by the setup's `mkdir -p runs` (owned by the trainer's uid)",
    "GENAUG_RUNS_DIR_2": "the same",
    "GENAUG_RUNS_DIR_R": "the same",
    "GENAUG_ADAPTERS_DIR": "compose creates it, empty (create_host_path)",
    "GENAUG_SHOTS_DIR": "compose creates it, empty (create_host_path)",
}



def gpu_ids(service: Mapping[str, Any]) -> list[str]:
    ids: list[str] = []
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {})
    for device in devices.get("devices", []):
        if "gpu" in device.get("capabilities", []):
            ids.extend(str(d) for d in device.get("device_ids", []))
    return ids


def trainer_services(compose: Mapping[str, Any]) -> dict[str, Any]:
    found = {
        name: svc
        for name, svc in compose["services"].items()
        if str(svc.get("build", {}).get("dockerfile", "")).endswith("trainer.Dockerfile")
    }
    assert found, "no service in docker-compose.yml builds docker/trainer.Dockerfile"
    return found


def generator_services(compose: Mapping[str, Any]) -> dict[str, Any]:
    """Services that build the service image and serve on a GPU (the CPU profiles' aside:
    ``cpu`` and ``split``)."""
    return {
        name: svc
        for name, svc in compose["services"].items()
        if str(svc.get("build", {}).get("dockerfile", "")).endswith("service.Dockerfile")
        and name != CPU_SERVICE and "split" not in svc.get("profiles", [])
    }


def serving_services(compose: Mapping[str, Any]) -> dict[str, Any]:
    """Every service running the service image: the GPU generators and the CPU one."""
    return {
        name: svc
        for name, svc in compose["services"].items()
        if str(svc.get("build", {}).get("dockerfile", "")).endswith("service.Dockerfile")
    }


def command_option(command: list[str], option: str) -> str:
    assert option in command, f"command {command} lacks {option}"
    return command[command.index(option) + 1]


