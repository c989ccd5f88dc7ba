"""docs/deploy.md's `docker compose --profile cpu up`, as far as it runs without Docker.

No engine runs here, so the container is played by a process: `genaug serve` started with
exactly the environment compose gives the `cpu` service (the image's ENV, then the service's
`environment` interpolated with .env.example as docker/.env), its command (the image's CMD),
and every path in that environment mapped to where the container would find it: a bind
mount's source (a folder compose creates empty is an empty folder here), a named volume (a
temporary folder), or a file the Dockerfile COPYs (the repo's). Only the listening address
changes: 127.0.0.1 on a free port instead of 0.0.0.0:8000. Like a reader of the doc, the test
also puts a LoRA in the adapters folder and names it in GENAUG_LORAS as .env.example shows.
Then /healthz, a generate (with and without the adapter) and a pool sample, through the
client, and SIGINT to the process group, as `docker compose stop` would. About a minute on
2 cores: marked slow.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from _docker_files import (
    CPU_SERVICE,
    DOCKERFILES,
    ENV_EXAMPLE,
    container_to_host,
    image_env,
    load_compose,
    parse_dockerfile,
    read_env_file,
    resolve,
)

from genaug.client import Client
from genaug.local_service import free_port
from genaug.service.testing import make_lora

LOOPBACK = "127.0.0.1"
#: The adapter a reader adds, written as .env.example's example writes one.
ADAPTER = "ink"


def _image_cmd() -> list[str]:
    (cmd,) = [i for i in parse_dockerfile(DOCKERFILES["service"]) if i.keyword == "CMD"][-1:]
    words: list[str] = json.loads(cmd.args)
    return words


def _map_path(path: str, svc: Mapping[str, Any], top: Mapping[str, Any], tmp: Path) -> str:
    """Where the process finds what the container would find at ``path``."""
    origin = container_to_host(path, svc, top, image="service")
    if origin.kind == "bind" and origin.path is not None and origin.mount is not None:
        if origin.mount.create_host_path and not (origin.path.exists()):
            # compose would create the folder, empty; make it here, never in the checkout
            made = tmp / "created" / origin.mount.target.strip("/")
            made.mkdir(parents=True, exist_ok=True)
            return str(made / Path(path).relative_to(origin.mount.target))
        return str(origin.path)
    if origin.kind == "volume" and origin.mount is not None:
        volume = tmp / "volumes" / origin.mount.source
        volume.mkdir(parents=True, exist_ok=True)
        return str(volume / Path(path).relative_to(origin.mount.target))
    if origin.kind == "image" and origin.path is not None:
        return str(origin.path)
    return path


def compose_environment(
    tmp: Path, dotenv: Mapping[str, str]
) -> tuple[dict[str, str], list[str], Mapping[str, Any], Mapping[str, Any]]:
    """The cpu service's environment and command, paths mapped, as compose would start it
    with ``dotenv`` as docker/.env."""
    compose = load_compose()
    resolved = resolve(compose, dotenv)
    svc = resolved["services"][CPU_SERVICE]
    top = resolved.get("volumes") or {}
    env = {**image_env("service"), **{k: str(v) for k, v in svc["environment"].items()}}
    for key, value in env.items():
        if key == "GENAUG_LORAS" and value:
            parts = (p.partition("=") for p in value.split(","))
            env[key] = ",".join(f"{n}={_map_path(p, svc, top, tmp)}" for n, _, p in parts)
        elif value.startswith("/"):
            env[key] = _map_path(value, svc, top, tmp)
    command = list(svc.get("command") or _image_cmd())
    return env, command, svc, top


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("compose-cpu")
    dotenv = read_env_file(ENV_EXAMPLE)
    dotenv["GENAUG_LORAS"] = f"{ADAPTER}=/adapters/{ADAPTER}.safetensors"
    env, command, svc, top = compose_environment(tmp, dotenv)
    # The reader's LoRA goes where the adapters mount's source is (compose made it empty).
    adapter = Path(env["GENAUG_LORAS"].partition("=")[2])
    adapter.parent.mkdir(parents=True, exist_ok=True)
    make_lora(adapter.parent, ADAPTER, seed=7)

    assert command[:2] == ["genaug", "serve"], command
    port = free_port()
    argv = [str(Path(sys.executable).parent / "genaug"), *command[1:]]
    argv[argv.index("--host") + 1] = LOOPBACK
    argv[argv.index("--port") + 1] = str(port)
    env["GENAUG_HOST"] = LOOPBACK
    # The container's whole environment, nothing of this process's but PATH and a HOME.
    home = tmp / "home"
    home.mkdir()
    process_env = {**env, "PATH": os.environ["PATH"], "HOME": str(home)}
    log = tmp / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=process_env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        yield f"http://{LOOPBACK}:{port}", env
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                pytest.fail("genaug serve ignored SIGINT for 30 s:\n" + log.read_text()[-3000:])
        if proc.returncode != 130:  # SIGINT: genaug serve's one line and exit 130, as a shell's
            pytest.fail(f"genaug serve ended {proc.returncode}:\n{log.read_text()[-3000:]}")


@pytest.mark.slow  # a minute on 2 shared cores: model load, pre-generation, the sample's wait
def test_cpu_profile_serves_generates_and_samples(
    served: tuple[str, dict[str, str]],
) -> None:
    url, env = served
    key = read_env_file(ENV_EXAMPLE)["GENAUG_API_KEY"]
    assert key in env["GENAUG_API_KEYS"].split(",")
    with Client(url, api_key=key) as client:
        client.wait_ready(timeout=180)
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
        info = client.info()
        assert info["model"]["kind"] == "tiny-digits", info["model"]
        assert info["device"]["type"] == "cpu", info["device"]
        assert [a["name"] for a in info["adapters"]] == [ADAPTER], info["adapters"]

        seed = random.Random(39).getrandbits(63)  # a seed as the planner draws them
        plain = client.generate("a handwritten three", n=2, seed=seed)
        assert plain.images.shape == (2, 64, 64, 3) and plain.images.dtype.name == "uint8"
        assert int(plain.seeds[0]) == seed
        adapted = client.generate("a handwritten three", n=2, seed=seed, adapter=ADAPTER)
        assert (adapted.images != plain.images).any(), "the LoRA changed nothing"

        sample = client.sample("digits", labels=["3", "8"], n=4, wait_s=120)
        assert len(sample) == 4, (sample.empty_labels, sample.stopped)
        assert set(sample.label_names[i] for i in sample.labels.tolist()) <= {"3", "8"}
        assert all(0 <= int(s) < 2**63 for s in sample.seeds)
