"""What docker/ and docker/k8s/ declare, checked without a Docker engine or a cluster.

No engine runs where the tests run, so `docker build` and `docker compose up` cannot be tried.
The files are validated instead as the tools would: the compose file (as written and as
interpolated with .env.example) against the Compose Specification's JSON schema, which
check-jsonschema ships, and every Kubernetes manifest against the API's schemas with
kubernetes-validate (strict: an unknown field is an error). The schemas catch misspelt keys
and wrong types; the tests below pin what no schema can say: GPU sets never overlap, the
trainer waits for a ready generator, every service has a profile so the CPU one starts alone,
the pool lives on a named volume, weights, adapters and shots are read-only, every file
.env.example names ships, ports stay on loopback, processes are not root, probes point at
the right endpoints, and the images install what CI tests with the same pins. The CPU
profile's journey is tests/docker/test_compose_cpu.py; the image's install steps run outside Docker
in tests/docker/test_compose_install.py.
"""

from __future__ import annotations

import ast
import copy
import importlib.resources
import json
import re
import shlex
import tomllib
from collections.abc import Mapping
from itertools import combinations
from pathlib import PurePosixPath
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from _docker_files import (
    CONSTRAINTS,
    CPU_SERVICE,
    DOCKER,
    DOCKERFILES,
    ENV_EXAMPLE,
    K8S,
    ROOT,
    EveryVariableSet,
    Mount,
    arg_defaults,
    base_images,
    container_to_host,
    image_to_repo,
    interpolate,
    load_compose,
    lora_paths,
    mounts,
    mounts_holding,
    parse_dockerfile,
    read_env_file,
    required_variables,
    resolve,
    walk_strings,
)
from packaging.requirements import Requirement
from packaging.version import Version

GENERATOR = "generator"
#: The Kubernetes release the manifests are validated against (kubernetes-validate's newest).
K8S_VERSION = "1.37.0"
#: Profiles run together as docs/deploy.md runs them: "gpu" is the base of the GPU setups,
#: "second-trainer" and "replicas" are added to it (alternatives: they share GPUs 5-7), and
#: "cpu" runs alone. Every profile of the compose file must appear here.
RUN_TOGETHER = {
    "gpu": ["gpu"],
    "gpu + second-trainer": ["gpu", "second-trainer"],
    "gpu + replicas": ["gpu", "replicas"],
    "cpu": ["cpu"],
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


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


@pytest.fixture(scope="module")
def env_example() -> dict[str, str]:
    return read_env_file(ENV_EXAMPLE)


@pytest.fixture(scope="module")
def resolved(compose: dict[str, Any], env_example: dict[str, str]) -> dict[str, Any]:
    """The compose file as `docker compose config` would see it with .env.example as .env."""
    try:
        data: dict[str, Any] = resolve(compose, env_example)
    except KeyError as missing:
        pytest.fail(f"docker/.env.example leaves a required variable unset: {missing}")
    return data


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((path.name, doc))
    assert docs, f"no manifests in {K8S}"
    return docs


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
    """Services that build the service image and serve on a GPU (the CPU profile's aside)."""
    return {
        name: svc
        for name, svc in compose["services"].items()
        if str(svc.get("build", {}).get("dockerfile", "")).endswith("service.Dockerfile")
        and name != CPU_SERVICE
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


# --- compose --------------------------------------------------------------------------------


def run_together(compose: Mapping[str, Any]) -> dict[str, list[str]]:
    """The sets of services that run at once (RUN_TOGETHER's profile sets)."""
    services = compose["services"]
    return {
        label: [n for n, s in services.items() if set(s.get("profiles", [])) & set(profiles)]
        for label, profiles in RUN_TOGETHER.items()
    }


def test_every_service_has_a_profile_so_the_cpu_one_starts_alone(
    compose: dict[str, Any],
) -> None:
    # `docker compose --profile cpu up` starts the CPU profile's services *and every service
    # without a profile*: one unprofiled GPU service and it fails on a machine without GPUs.
    services = compose["services"]
    unprofiled = sorted(n for n, s in services.items() if not s.get("profiles"))
    assert not unprofiled, (
        f"{unprofiled} have no profile: `--profile cpu up` would start them too; give each "
        "one (gpu, second-trainer, replicas, cpu)"
    )
    declared = {p for s in services.values() for p in s["profiles"]}
    listed = {p for profiles in RUN_TOGETHER.values() for p in profiles}
    assert declared == listed, (
        f"profiles {sorted(declared ^ listed)}: add them to RUN_TOGETHER, with the profiles "
        "docs/deploy.md runs them with, so the GPU checks see them"
    )
    assert run_together(compose)["cpu"] == [CPU_SERVICE]
    # A dependency whose profiles are all off is an error in compose ("service ... is not
    # enabled by the active profiles"): every depends_on target runs with its dependant.
    for label, names in run_together(compose).items():
        for name in names:
            for dep in services[name].get("depends_on", {}):
                assert dep in names, f"{name} depends on {dep}, which {label} does not start"


def test_gpu_sets_are_explicit_and_disjoint_among_services_that_run_together(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    assigned: dict[str, set[str]] = {}
    for name, svc in services.items():
        assert "gpus" not in svc, f"{name}: use device_ids, not `gpus` (which may mean all)"
        devices = svc.get("deploy", {}).get("resources", {}).get("reservations", {})
        for device in devices.get("devices", []):
            assert "count" not in device, (
                f"{name}: a GPU count lets Docker pick the GPUs; name them with device_ids"
            )
        ids = gpu_ids(svc)
        if ids:
            assert len(ids) == len(set(ids)), f"{name}: a GPU is listed twice: {ids}"
            assigned[name] = set(ids)
    for name in generator_services(compose):
        assert assigned.get(name) and len(assigned[name]) == 1, (
            f"a generator must own exactly one GPU; {name} has {assigned.get(name)}"
        )
    for name in trainer_services(compose):
        assert assigned.get(name), f"{name} reserves no GPU"
    for profile, names in run_together(compose).items():
        for a, b in combinations([n for n in names if n in assigned], 2):
            shared = assigned[a] & assigned[b]
            assert not shared, f"{a} and {b} ({profile}) share GPUs {sorted(shared)}"


def test_trainer_gpu_flags_use_the_containers_own_numbering(resolved: dict[str, Any]) -> None:
    # device_ids ["1","2","3","4"] appear inside the container as GPUs 0..3.
    for name, svc in trainer_services(resolved).items():
        flag = command_option(svc["command"], "--gpus")
        expected = ",".join(str(i) for i in range(len(gpu_ids(svc))))
        assert flag == expected, (
            f"{name}: --gpus {flag} but the container sees {len(gpu_ids(svc))} GPUs "
            f"numbered from 0, so it must be --gpus {expected}"
        )
    generator = resolved["services"][GENERATOR]
    assert generator["environment"]["GENAUG_DEVICE"] == "cuda:0", (
        "the generator's one pinned GPU is cuda:0 inside its container"
    )


def test_second_trainer_profile_shares_the_generator(compose: dict[str, Any]) -> None:
    trainers = trainer_services(compose)
    together = run_together(compose)
    first = [n for n in trainers if n in together["gpu"]]
    second = [n for n in trainers if "second-trainer" in trainers[n].get("profiles", [])]
    assert first, "profile gpu starts no trainer"
    assert second, "no trainer under the profile 'second-trainer'"
    assert GENERATOR in together["gpu"] and GENERATOR in together["gpu + second-trainer"]
    for name in first + second:
        url = trainers[name]["environment"]["GENAUG_URL"]
        assert url == f"http://{GENERATOR}:8000", f"{name}: GENAUG_URL={url}, not the generator"
        service_flag = command_option(trainers[name]["command"], "--service")
        assert service_flag == url, f"{name}: --service {service_flag} differs from GENAUG_URL"


def test_trainers_start_only_when_their_generators_are_healthy(compose: dict[str, Any]) -> None:
    serving = serving_services(compose)
    for name, generator in serving.items():
        check = generator.get("healthcheck", {})
        assert check.get("test"), f"{name} has no healthcheck; depends_on cannot wait for it"
        command = " ".join(check["test"]) if isinstance(check["test"], list) else check["test"]
        assert "/readyz" in command, f"{name}: healthcheck must probe /readyz: {command}"
        assert "curl" not in command and "wget" not in command, "healthcheck must not assume curl"
        assert check.get("start_period"), f"{name}: loading a model takes time: start_period"
    for name, svc in trainer_services(compose).items():
        depends = svc.get("depends_on")
        assert isinstance(depends, dict), f"{name}: depends_on must be the long form"
        # a trainer waits for every GPU generator of its own profile
        profiles = set(svc.get("profiles", []))
        mine = [g for g, s in generator_services(compose).items()
                if profiles & set(s.get("profiles", []))]
        assert mine, f"{name}: no generator runs with it"
        for generator in mine:
            assert generator in depends, f"{name} does not wait for {generator}"
            condition = depends[generator].get("condition")
            assert condition == "service_healthy", f"{name}: waits for {generator} {condition}"


def test_replicas_profile_shares_one_postgres_pool(
    compose: dict[str, Any], resolved: dict[str, Any], env_example: dict[str, str]
) -> None:
    services = resolved["services"]
    replicas = {n: s for n, s in generator_services(resolved).items()
                if "replicas" in s.get("profiles", [])}
    assert len(replicas) >= 2, "the replicas profile needs at least two generators"
    db = services["postgres"]
    assert "replicas" in db.get("profiles", [])
    name, _, tag = db["image"].partition(":")
    assert name == "postgres" and re.fullmatch(r"\d+\.\d+", tag), (
        f"postgres must be the official image pinned to a minor version, not {db['image']}"
    )
    raw_db_env = compose["services"]["postgres"]["environment"]
    assert "${GENAUG_DB_PASSWORD" in raw_db_env["POSTGRES_PASSWORD"], (
        "the database password must come from docker/.env"
    )
    top = compose.get("volumes") or {}
    data = [m for m in mounts(db, top) if m.target == "/var/lib/postgresql/data"]
    assert data and data[0].type == "volume" and data[0].source in top, (
        "the database lives on a named volume"
    )
    check = " ".join(db.get("healthcheck", {}).get("test", []))
    assert "pg_isready" in check, f"postgres healthcheck must run pg_isready: {check}"
    assert not db.get("ports"), "the database is for the replicas only: publish no port"
    partitions = []
    for rname, replica in replicas.items():
        env = replica["environment"]
        assert "GENAUG_POOL_PATH" not in env, f"{rname}: a pool URL and a path are refused"
        url = env["GENAUG_POOL_URL"]
        password = env_example["GENAUG_DB_PASSWORD"]
        assert url == f"postgresql://genaug:{password}@postgres:5432/genaug", (rname, url)
        assert replica["depends_on"]["postgres"]["condition"] == "service_healthy"
        partitions.append(env["GENAUG_REPLICA"])
    count = len(replicas)
    assert sorted(partitions) == [f"{i}/{count}" for i in range(count)], partitions


def mounts_of_setting(
    compose: dict[str, Any], resolved: dict[str, Any], service: str, variable: str
) -> tuple[PurePosixPath, list[Mount]]:
    """The path a service's setting names inside its container, and the mounts holding it."""
    svc = resolved["services"][service]
    path = PurePosixPath(svc["environment"][variable])
    return path, mounts_holding(path, svc, compose.get("volumes") or {})


@pytest.mark.parametrize("name", [GENERATOR, CPU_SERVICE])
def test_pool_on_a_named_volume(
    name: str, compose: dict[str, Any], resolved: dict[str, Any]
) -> None:
    pool, holding = mounts_of_setting(compose, resolved, name, "GENAUG_POOL_PATH")
    assert holding, f"GENAUG_POOL_PATH={pool} is on no mount: the pool would die with the container"
    mount = max(holding, key=lambda m: len(m.target))
    assert mount.type == "volume" and mount.source in (compose.get("volumes") or {}), (
        f"the pool's mount {mount} must be a named volume declared under top-level volumes"
    )
    assert not mount.read_only, "the pool volume must be writable"


def test_weights_and_training_data_are_mounted_read_only(
    compose: dict[str, Any], resolved: dict[str, Any]
) -> None:
    model, holding = mounts_of_setting(compose, resolved, GENERATOR, "GENAUG_MODEL")
    assert holding, f"GENAUG_MODEL={model} is not under any mount"
    for mount in holding:
        assert mount.read_only, f"weights mount {mount.target} must be read-only"
    for name, svc in trainer_services(resolved).items():
        data = PurePosixPath(command_option(svc["command"], "--data"))
        data_mounts = mounts_holding(data, svc, compose.get("volumes") or {})
        assert data_mounts and all(m.read_only for m in data_mounts), (
            f"{name}: training data {data} must come from a read-only mount"
        )


def test_published_ports_bind_loopback(resolved: dict[str, Any]) -> None:
    published = 0
    for name, svc in resolved["services"].items():
        for port in svc.get("ports", []):
            published += 1
            if isinstance(port, dict):
                host_ip = port.get("host_ip")
            else:
                host_ip = str(port).split(":")[0] if str(port).count(":") == 2 else None
            assert host_ip == "127.0.0.1", f"{name}: port {port!r} is not bound to 127.0.0.1"
        assert "network_mode" not in svc or svc["network_mode"] != "host", (
            f"{name}: network_mode host publishes every port on every interface"
        )
    assert published, "the generator publishes no port for notebooks on this machine"


def test_api_key_comes_from_the_env_file_not_the_compose_file(
    compose: dict[str, Any], env_example: dict[str, str]
) -> None:
    generator_env = compose["services"][GENERATOR]["environment"]
    assert "${" in str(generator_env.get("GENAUG_API_KEYS", "")), (
        "GENAUG_API_KEYS must be interpolated from docker/.env, never written in the compose file"
    )
    for name, svc in trainer_services(compose).items():
        assert "${" in str(svc["environment"].get("GENAUG_API_KEY", "")), (
            f"{name}: GENAUG_API_KEY must come from docker/.env"
        )
    accepted = env_example["GENAUG_API_KEYS"].split(",")
    assert env_example["GENAUG_API_KEY"] in accepted, (
        ".env.example: the trainers' GENAUG_API_KEY must be one of GENAUG_API_KEYS"
    )


def test_generator_listens_on_all_interfaces_inside_its_container(
    resolved: dict[str, Any],
) -> None:
    env = resolved["services"][GENERATOR]["environment"]
    assert env.get("GENAUG_HOST") == "0.0.0.0", (
        "the service defaults to 127.0.0.1, unreachable from other containers: "
        "set GENAUG_HOST=0.0.0.0"
    )


def test_every_compose_variable_is_documented_in_env_example(
    compose: dict[str, Any], env_example: dict[str, str]
) -> None:
    used: set[str] = set()
    for text in walk_strings(compose):
        interpolate(text, EveryVariableSet(), used)
    missing = sorted(used - env_example.keys())
    assert not missing, f"docker/.env.example does not document {missing}"
    stale = sorted(env_example.keys() - used)
    assert not stale, f"docker/.env.example lists variables compose never uses: {stale}"
    # With .env.example copied to .env, every required variable is satisfied.
    resolve(compose, env_example)


def test_compose_images_and_users(resolved: dict[str, Any]) -> None:
    for name, svc in resolved["services"].items():
        image = svc.get("image", "")
        assert ":" in image and not image.endswith(":latest"), f"{name}: image {image} unpinned"
        user = str(svc.get("user", ""))
        assert user.split(":")[0] not in ("0", "root"), f"{name}: runs as root ({user})"


def _compose_schema() -> dict[str, Any]:
    # The Compose Specification's schema as check-jsonschema vendors it (refreshed with each
    # of its releases; `check-jsonschema --builtin-schema vendor.compose-spec FILE` is the CLI).
    text = (importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
            / "compose-spec.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


def _schema_errors(document: Any) -> list[str]:
    schema = _compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    return sorted(
        f"{'.'.join(str(p) for p in error.absolute_path) or '(top)'}: {error.message}"
        for error in validator.iter_errors(document)
    )


def test_compose_file_follows_the_compose_specification(
    compose: dict[str, Any], resolved: dict[str, Any]
) -> None:
    # As written (anchors merged, ${...} unresolved) and as compose validates it: after
    # interpolation with .env.example as .env.
    assert _schema_errors(compose) == []
    assert _schema_errors(resolved) == []


def test_compose_schema_check_catches_a_misspelt_key(compose: dict[str, Any]) -> None:
    # The check above is live: one misspelt key in a GPU reservation is caught.
    broken = copy.deepcopy(compose)
    devices = broken["services"][GENERATOR]["deploy"]["resources"]["reservations"]["devices"]
    devices[0]["device_id"] = devices[0].pop("device_ids")
    assert any("device_id" in e for e in _schema_errors(broken)), _schema_errors(broken)


def test_env_example_sets_every_variable_compose_requires(
    compose: dict[str, Any], env_example: dict[str, str]
) -> None:
    required = required_variables(compose)
    assert required, "docker-compose.yml requires no variable (${X:?...}): was the parser lost?"
    unset = sorted(n for n in required if not env_example.get(n))
    assert not unset, (
        f"docker/.env.example leaves {unset} unset, which compose requires (${{X:?...}}): "
        "`cp .env.example .env && docker compose ...` would stop at once; set each there"
    )


def test_every_file_env_example_names_ships(
    compose: dict[str, Any], resolved: dict[str, Any], env_example: dict[str, str]
) -> None:
    """Each path compose hands a service (with .env.example as .env) exists where it says:
    a bind mount's source in the repo, or a file the image COPYs; folders of yours are
    YOUR_FOLDERS. And every path-like value of .env.example reaches one of those checks."""
    top = compose.get("volumes") or {}
    checked: set[str] = set()
    problems: list[str] = []
    for name, raw in compose["services"].items():
        svc = resolved["services"][name]
        image = "service" if name in serving_services(compose) else "trainer"
        yours: set[str] = set()  # mount targets holding a folder of yours
        for mount_raw, mount in zip(raw.get("volumes", []), mounts(svc, top), strict=True):
            if mount.type != "bind":
                continue
            source = str(mount_raw["source"] if isinstance(mount_raw, dict) else mount_raw)
            names: set[str] = set()
            interpolate(source, EveryVariableSet(), names)
            checked |= names
            host = (DOCKER / mount.source).resolve()
            if names & YOUR_FOLDERS.keys():
                yours.add(mount.target)
            elif not (host.exists() or mount.create_host_path):
                problems.append(f"{name}: bind source {mount.source} -> {host} does not exist")
        for key, value in svc.get("environment", {}).items():
            paths = lora_paths(value) if key == "GENAUG_LORAS" else [value]
            for path in (str(v) for v in paths if str(v).startswith("/")):
                interpolate(str(raw["environment"][key]), EveryVariableSet(), checked)
                origin = container_to_host(path, svc, top, image=image)
                if origin.mount and origin.mount.target in yours:
                    continue
                if origin.path is None or not origin.path.is_relative_to(ROOT):
                    continue  # a named volume, or the image's own files (/tmp, ...)
                if origin.path.exists():
                    continue
                mount = origin.mount
                if mount and mount.create_host_path and mount.target == path:
                    continue  # compose makes the folder itself at start
                problems.append(f"{name}: {key}={value} -> {origin.path} does not exist")
    assert not problems, "files .env.example names do not ship:\n" + "\n".join(problems)
    for name, value in env_example.items():
        if "/" in value or re.search(r"\.(ya?ml|safetensors|pt|db|json)$", value):
            assert name in checked or name in YOUR_FOLDERS, (
                f".env.example: {name}={value} looks like a path that no test maps to the repo "
                "or the image"
            )
    for name in YOUR_FOLDERS:
        assert name in env_example, f"YOUR_FOLDERS lists {name}, which .env.example lacks"


def test_trainers_recipes_are_in_the_recipe_file(
    resolved: dict[str, Any], env_example: dict[str, str]
) -> None:
    recipes_file = ROOT / "recipes" / env_example["GENAUG_RECIPES_FILE"]
    assert (DOCKER / env_example["GENAUG_RECIPES_DIR"]).resolve() == ROOT / "recipes"
    assert recipes_file.is_file(), f"GENAUG_RECIPES_FILE: {recipes_file} does not ship"
    names = {r["name"] for r in yaml.safe_load(recipes_file.read_text())["recipes"]}
    for name, svc in trainer_services(resolved).items():
        recipe = command_option(svc["command"], "--recipe")
        assert recipe in names, (
            f"{name}: --recipe {recipe} is not in {recipes_file.name} ({sorted(names)}): set "
            "GENAUG_RECIPE in .env.example to one of them"
        )


def test_every_server_mounts_adapters_and_shots_read_only(
    compose: dict[str, Any], resolved: dict[str, Any]
) -> None:
    top = compose.get("volumes") or {}
    example = "wounds=/adapters/wounds.safetensors"  # as .env.example and deploy.md write it
    assert example in ENV_EXAMPLE.read_text()
    for name, svc in serving_services(resolved).items():
        env = svc["environment"]
        raw_env = compose["services"][name]["environment"]
        assert "${GENAUG_LORAS" in str(raw_env.get("GENAUG_LORAS")), (
            f"{name}: GENAUG_LORAS must come from docker/.env"
        )
        by_target = {m.target: m for m in mounts(svc, top)}
        root = env.get("GENAUG_DATA_ROOT")
        assert root in by_target, f"{name}: GENAUG_DATA_ROOT={root} is not a mount of its own"
        for path in [root, *lora_paths(example)]:
            origin = container_to_host(path, svc, top, image="service")
            assert origin.kind == "bind" and origin.mount and origin.mount.read_only, (
                f"{name}: {path} must come from a read-only bind mount of your folder, "
                f"not {origin}"
            )


def test_cpu_profile_serves_the_tiny_model_without_a_gpu(resolved: dict[str, Any]) -> None:
    svc = resolved["services"][CPU_SERVICE]
    assert svc["profiles"] == ["cpu"]
    assert not gpu_ids(svc) and "deploy" not in svc and "gpus" not in svc, (
        f"{CPU_SERVICE}: reserves a GPU"
    )
    env = svc["environment"]
    assert env["GENAUG_DEVICE"] == "cpu" and env["GENAUG_MODEL"] == "tiny-digits", env
    recipes = image_to_repo(env["GENAUG_RECIPES"], image="service")
    assert recipes.path == ROOT / "recipes" / "digits.yaml", recipes


# --- Dockerfiles ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_dockerfile_runs_as_non_root(kind: str) -> None:
    users = [i for i in parse_dockerfile(DOCKERFILES[kind]) if i.keyword == "USER"]
    assert users, f"{kind}.Dockerfile has no USER: the container would run as root"
    last = users[-1].args.split(":")[0]
    assert last not in ("0", "root"), f"{kind}.Dockerfile ends as USER {users[-1].args}"


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_base_images_are_pinned(kind: str) -> None:
    for image in base_images(DOCKERFILES[kind]):
        name, _, tag = image.rpartition(":")
        assert name and tag and "/" not in tag, f"{kind}: base image {image} has no tag"
        assert tag != "latest" and re.match(r"\d+\.\d+", tag), (
            f"{kind}: base image {image} is not pinned to a version"
        )


def test_service_healthcheck_probes_readyz_with_python() -> None:
    checks = [i for i in parse_dockerfile(DOCKERFILES["service"]) if i.keyword == "HEALTHCHECK"]
    assert checks, "service.Dockerfile has no HEALTHCHECK"
    args = checks[-1].args
    assert "/readyz" in args, f"HEALTHCHECK must probe /readyz: {args}"
    assert "python" in args and "curl" not in args and "wget" not in args, (
        f"HEALTHCHECK must use python (the base image may lack curl): {args}"
    )
    assert "--start-period" in args, "HEALTHCHECK needs a start period for model loading"


def _pip_installs(kind: str) -> list[list[str]]:
    """The argument lists of every `pip install` in a Dockerfile's RUN instructions."""
    installs = []
    for ins in parse_dockerfile(DOCKERFILES[kind]):
        if ins.keyword != "RUN":
            continue
        words = shlex.split(ins.args)
        for i in range(len(words) - 1):
            if words[i] == "pip" and words[i + 1] == "install":
                rest = words[i + 2 :]
                ends = [j for j, w in enumerate(rest) if w in ("&&", ";", "||", "|")]
                installs.append(rest[: ends[0]] if ends else rest)
    assert installs, f"{kind}.Dockerfile installs nothing with pip"
    return installs


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_pip_installs_the_matching_extra_with_ci_constraints(
    kind: str, pyproject: dict[str, Any]
) -> None:
    extras = pyproject["project"]["optional-dependencies"]
    installs = _pip_installs(kind)
    targets = [w for args in installs for w in args if w.startswith(".[")]
    assert targets == [f".[{kind}]"], (
        f"{kind}.Dockerfile must install the project with the [{kind}] extra, found {targets}"
    )
    for target in targets:
        for extra in target[2:-1].split(","):
            assert extra in extras, f"{kind}: extra [{extra}] is not declared in pyproject.toml"
    for args in installs:
        assert "-c" in args and args[args.index("-c") + 1] == "constraints/cpu.txt", (
            f"{kind}: `pip install {' '.join(args)}` must use CI's constraints/cpu.txt"
        )
        joined = " ".join(args)
        assert "index-url" not in joined and "+cpu" not in joined, (
            f"{kind}: the GPU image must not name the CPU wheel index: {joined}"
        )


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_dockerfile_copies_exist_and_cover_every_package_dir(
    kind: str, pyproject: dict[str, Any]
) -> None:
    copied: list[str] = []
    for ins in parse_dockerfile(DOCKERFILES[kind]):
        if ins.keyword == "COPY":
            words = [w for w in shlex.split(ins.args) if not w.startswith("--")]
            for source in words[:-1]:
                assert (ROOT / source).exists(), f"{kind}: COPY {source} does not exist"
                copied.append(source.rstrip("/"))
    for path in ["pyproject.toml", "constraints/cpu.txt"] + sorted(
        set(pyproject["tool"]["setuptools"]["package-dir"].values())
    ):
        assert any(path == c or path.startswith(c + "/") for c in copied), (
            f"{kind}.Dockerfile does not COPY {path}; `pip install .` needs it"
        )


def _constraints() -> list[Requirement]:
    lines = (line.split("#")[0].strip() for line in CONSTRAINTS.read_text().splitlines())
    return [Requirement(line) for line in lines if line]


def _torch_pin() -> Version:
    torch = [r for r in _constraints() if r.name == "torch"]
    assert len(torch) == 1, f"{CONSTRAINTS} must pin torch exactly once"
    spec = list(torch[0].specifier)
    assert len(spec) == 1 and spec[0].operator == "==", f"torch pin must be ==X.Y.Z: {spec}"
    return Version(spec[0].version)


def test_torch_policy_consistent_with_constraints(pyproject: dict[str, Any]) -> None:
    # constraints/cpu.txt pins a public version. PEP 440 ignores local labels for such a pin,
    # so the base image's torch X+cuNNN satisfies it and pip keeps the CUDA build.
    pin = _torch_pin()
    assert not pin.local, (
        f"constraints/cpu.txt pins torch {pin}: a local label would force that build into the "
        "GPU image; pin the public version and pick the CPU wheel by index URL in CI"
    )
    args = arg_defaults(parse_dockerfile(DOCKERFILES["service"]))
    assert Version(args.get("TORCH_VERSION", "0")) == pin, (
        f"service.Dockerfile TORCH_VERSION={args.get('TORCH_VERSION')} but constraints pin "
        f"torch=={pin}: pip would replace the base image's CUDA torch"
    )
    (image,) = base_images(DOCKERFILES["service"])
    assert image.startswith(f"pytorch/pytorch:{pin}-cuda"), (
        f"service base {image} is not the CUDA PyTorch image of torch {pin}"
    )
    service_deps = [
        Requirement(r) for r in pyproject["project"]["optional-dependencies"]["service"]
    ]
    torch_req = next(r for r in service_deps if r.name == "torch")
    assert pin in torch_req.specifier, f"torch {pin} does not satisfy pyproject's {torch_req}"


def test_tensorflow_base_satisfies_the_trainer_extra(pyproject: dict[str, Any]) -> None:
    (image,) = base_images(DOCKERFILES["trainer"])
    match = re.fullmatch(r"tensorflow/tensorflow:(\d+\.\d+\.\d+)-gpu", image)
    assert match, f"trainer base {image} is not a pinned tensorflow/tensorflow:X.Y.Z-gpu"
    version = Version(match.group(1))
    deps = [Requirement(r) for r in pyproject["project"]["optional-dependencies"]["trainer"]]
    tf = next(r for r in deps if r.name == "tensorflow")
    assert version in tf.specifier, f"base tensorflow {version} does not satisfy {tf}"
    for req in _constraints():
        if req.name in ("tensorflow", "tensorflow-cpu"):
            assert version in req.specifier, f"constraints pin {req}, base has {version}"


# --- Kubernetes -----------------------------------------------------------------------------


def _genaug(doc: dict[str, Any]) -> bool:
    return bool(doc["metadata"].get("labels", {}).get("app.kubernetes.io/name")
                == "genaug-service")


def _workloads(docs: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """The generator workloads (the database's StatefulSet is checked on its own)."""
    found = [(f, d) for f, d in docs
             if d["kind"] in ("Deployment", "StatefulSet") and _genaug(d)]
    kinds = {d["kind"] for _, d in found}
    assert "Deployment" in kinds, "docker/k8s/ has no Deployment"
    assert "StatefulSet" in kinds, "docker/k8s/ has no StatefulSet for several replicas"
    return found


def test_k8s_probes_gpu_and_security(k8s_docs: list[tuple[str, dict[str, Any]]]) -> None:
    for file, workload in _workloads(k8s_docs):
        where = f"{file} {workload['kind']}"
        pod = workload["spec"]["template"]["spec"]
        pod_security = pod.get("securityContext", {})
        assert pod_security.get("runAsNonRoot") is True, f"{where}: runAsNonRoot must be true"
        assert pod_security.get("runAsUser", 0) != 0, f"{where}: runAsUser must not be 0"
        assert pod_security.get("fsGroup"), f"{where}: fsGroup makes the pool volume writable"
        (container,) = pod["containers"]
        image = container["image"]
        assert ":" in image and not image.endswith(":latest"), f"{where}: image {image} unpinned"
        limits = container.get("resources", {}).get("limits", {})
        assert str(limits.get("nvidia.com/gpu")) == "1", (
            f"{where}: one GPU per replica: limits nvidia.com/gpu must be 1, got {limits}"
        )
        ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
        for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
            get = container.get(probe, {}).get("httpGet", {})
            assert get.get("path") == path, f"{where}: {probe} must GET {path}, has {get}"
            port = get.get("port")
            assert port in ports or port in ports.values(), f"{where}: {probe} port {port}?"
        security = container.get("securityContext", {})
        assert security.get("allowPrivilegeEscalation") is False, (
            f"{where}: allowPrivilegeEscalation must be false"
        )
        env = {e["name"]: e for e in container.get("env", [])}
        assert env["GENAUG_HOST"].get("value") == "0.0.0.0", f"{where}: GENAUG_HOST 0.0.0.0"
        assert "secretKeyRef" in env["GENAUG_API_KEYS"].get("valueFrom", {}), (
            f"{where}: GENAUG_API_KEYS must come from a Secret"
        )
        mounts_by_path = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
        model = PurePosixPath(env["GENAUG_MODEL"]["value"])
        model_mounts = [m for p, m in mounts_by_path.items() if model.is_relative_to(p)]
        assert model_mounts and all(m.get("readOnly") for m in model_mounts), (
            f"{where}: the weights mount must be readOnly"
        )
        if "GENAUG_POOL_URL" in env:
            assert "secretKeyRef" in env["GENAUG_POOL_URL"].get("valueFrom", {}), (
                f"{where}: GENAUG_POOL_URL holds a password: it must come from a Secret"
            )
            assert "GENAUG_POOL_PATH" not in env, f"{where}: a pool URL and a path are refused"
        else:
            pool = PurePosixPath(env["GENAUG_POOL_PATH"]["value"])
            pool_mounts = [m for p, m in mounts_by_path.items() if pool.is_relative_to(p)]
            assert pool_mounts, f"{where}: GENAUG_POOL_PATH={pool} is on no volume"


def test_k8s_pool_storage_sqlite_single_writer_or_shared_postgres(
    k8s_docs: list[tuple[str, dict[str, Any]]],
) -> None:
    claims = {d["metadata"]["name"]: d for _, d in k8s_docs if d["kind"] == "PersistentVolumeClaim"}
    for file, workload in _workloads(k8s_docs):
        pod = workload["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = {e["name"]: e for e in container["env"]}
        if workload["kind"] == "Deployment":
            pool = PurePosixPath(env["GENAUG_POOL_PATH"]["value"])
            mount = max(
                (m for m in container["volumeMounts"] if pool.is_relative_to(m["mountPath"])),
                key=lambda m: len(m["mountPath"]),
            )
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            claim = volumes[mount["name"]].get("persistentVolumeClaim", {}).get("claimName")
            assert claim in claims, f"{file}: pool volume must be a PVC declared in docker/k8s/"
            assert claims[claim]["spec"]["accessModes"] == ["ReadWriteOnce"], (
                f"{file}: the pool claim is SQLite's: ReadWriteOnce"
            )
            assert workload["spec"]["replicas"] == 1, (
                f"{file}: one SQLite pool per claim means one replica; scale with the StatefulSet"
            )
            assert workload["spec"].get("strategy", {}).get("type") == "Recreate", (
                f"{file}: a rolling update would open the pool from two pods; use Recreate"
            )
        else:
            # Replicas share one PostgreSQL pool; i of GENAUG_REPLICA=i/N is the pod's ordinal
            # (set by the entrypoint from the pod name), N is written next to `replicas`.
            assert "GENAUG_POOL_URL" in env, f"{file}: replicas share a pool: GENAUG_POOL_URL"
            count = int(env["GENAUG_REPLICAS"]["value"])
            assert count == workload["spec"]["replicas"], (
                f"{file}: GENAUG_REPLICAS={count} but replicas={workload['spec']['replicas']}"
            )
            script = " ".join(container.get("command", []) + container.get("args", []))
            assert 'GENAUG_REPLICA="${HOSTNAME##*-}/${GENAUG_REPLICAS}"' in script, script
            assert "exec genaug serve" in script, f"{file}: the entrypoint must exec the server"


def test_k8s_postgres_for_the_shared_pool(k8s_docs: list[tuple[str, dict[str, Any]]]) -> None:
    (db,) = [d for _, d in k8s_docs if d["kind"] == "StatefulSet"
             and d["metadata"]["labels"]["app.kubernetes.io/name"] == "genaug-postgres"]
    pod = db["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    name, _, tag = container["image"].partition(":")
    assert name == "postgres" and re.fullmatch(r"\d+\.\d+", tag), container["image"]
    assert pod["securityContext"].get("runAsNonRoot") is True
    env = {e["name"]: e for e in container["env"]}
    assert "secretKeyRef" in env["POSTGRES_PASSWORD"]["valueFrom"], "password from a Secret"
    assert "pg_isready" in container["readinessProbe"]["exec"]["command"]
    (template,) = db["spec"]["volumeClaimTemplates"]
    mount = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mount[template["metadata"]["name"]] == "/var/lib/postgresql/data"
    assert env["PGDATA"]["value"].startswith("/var/lib/postgresql/data/"), "PGDATA in a subfolder"
    services = [d for _, d in k8s_docs if d["kind"] == "Service"
                and d["metadata"]["name"] == db["spec"]["serviceName"]]
    assert services and services[0]["spec"]["selector"].items() <= (
        pod and db["spec"]["template"]["metadata"]["labels"].items())
    generators = [d for _, d in _workloads(k8s_docs) if d["kind"] == "StatefulSet"]
    for workload in generators:
        (gen,) = workload["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e for e in gen["env"]}
        secret = env["GENAUG_POOL_URL"]["valueFrom"]["secretKeyRef"]["name"]
        assert secret == "genaug-pool-url"


def test_k8s_services_select_the_generator_pods(
    k8s_docs: list[tuple[str, dict[str, Any]]],
) -> None:
    services = [(f, d) for f, d in k8s_docs if d["kind"] == "Service" and _genaug(d)]
    assert services, "docker/k8s/ has no Service"
    for file, workload in _workloads(k8s_docs):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        selector = workload["spec"]["selector"]["matchLabels"]
        assert selector.items() <= labels.items(), f"{file}: selector does not match pod labels"
        ports = {p["name"] for p in workload["spec"]["template"]["spec"]["containers"][0]["ports"]}
        for sfile, service in services:
            assert service["spec"]["selector"].items() <= labels.items(), (
                f"{sfile}: Service {service['metadata']['name']} does not select {file}'s pods"
            )
            for port in service["spec"]["ports"]:
                assert port["targetPort"] in ports or port["targetPort"] == 8000, (
                    f"{sfile}: targetPort {port['targetPort']} is not a container port"
                )
        if workload["kind"] == "StatefulSet":
            headless = [s for _, s in services if s["spec"].get("clusterIP") == "None"]
            names = {s["metadata"]["name"] for s in headless}
            assert workload["spec"]["serviceName"] in names, (
                f"{file}: serviceName must be a headless Service (stable per-replica names)"
            )


def test_k8s_manifests_follow_the_kubernetes_api(
    k8s_docs: list[tuple[str, dict[str, Any]]],
) -> None:
    problems = []
    for file, doc in k8s_docs:
        if doc["apiVersion"].startswith("keda.sh/"):
            continue  # KEDA's own CRD schemas check these: tests/docker/test_keda.py
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.absolute_path) or "(top)"
            problems.append(f"{file} {doc.get('kind')}: {path}: {error.message}")
    assert not problems, "\n".join(problems)


def test_k8s_validation_catches_a_misspelt_field(
    k8s_docs: list[tuple[str, dict[str, Any]]],
) -> None:
    # The check above is live: a readOnly mount written read_only is refused.
    _, workload = _workloads(k8s_docs)[0]
    broken = copy.deepcopy(workload)
    mount = broken["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]
    mount["read_only"] = mount.pop("readOnly")
    with pytest.raises(kubernetes_validate.ValidationError, match="read_only"):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_k8s_workloads_mount_adapters_and_shots_and_name_shipped_recipes(
    k8s_docs: list[tuple[str, dict[str, Any]]],
) -> None:
    claims = {d["metadata"]["name"] for _, d in k8s_docs if d["kind"] == "PersistentVolumeClaim"}
    example = "wounds=/adapters/wounds.safetensors"  # as docs/deploy.md writes it
    for file, workload in _workloads(k8s_docs):
        pod = workload["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        recipes = image_to_repo(str(env["GENAUG_RECIPES"]), image="service")
        assert recipes.path and recipes.path.is_file(), (
            f"{file}: GENAUG_RECIPES={env['GENAUG_RECIPES']} is not a file the image ships "
            f"({recipes})"
        )
        assert "GENAUG_LORAS" in env, f"{file}: no GENAUG_LORAS to name adapters in"
        volumes = {v["name"]: v for v in pod["volumes"]}
        for path in [str(env.get("GENAUG_DATA_ROOT")), *lora_paths(example)]:
            holding = [m for m in container["volumeMounts"]
                       if PurePosixPath(path).is_relative_to(m["mountPath"])]
            assert holding, f"{file}: {path} is on no volume"
            mount = max(holding, key=lambda m: len(m["mountPath"]))
            assert mount.get("readOnly") is True, f"{file}: {mount['mountPath']} must be readOnly"
            claim = volumes[mount["name"]].get("persistentVolumeClaim", {})
            assert claim.get("claimName") in claims and claim.get("readOnly") is True, (
                f"{file}: {mount['mountPath']} must be a read-only claim declared in docker/k8s/"
            )


def test_every_generator_keeps_its_compile_cache_on_a_shared_writable_volume(
    compose: dict[str, Any], resolved: dict[str, Any],
    k8s_docs: list[tuple[str, dict[str, Any]]],
) -> None:
    """GENAUG_COMPILE_CACHE on a volume of its own, writable, that every generator of a
    deployment shares (compose: one named volume; Kubernetes: one claim), and a startupProbe
    on /readyz long enough for a cold start (the other probes begin after it)."""
    top = compose.get("volumes") or {}
    sources = set()
    for name, svc in serving_services(resolved).items():
        path = svc["environment"].get("GENAUG_COMPILE_CACHE")
        assert path, f"{name}: GENAUG_COMPILE_CACHE is not set"
        (mount,) = [m for m in mounts(svc, top) if m.target == path]
        assert mount.type == "volume" and not mount.read_only, f"{name}: {mount}"
        sources.add(mount.source)
    assert sources == {"genaug-compile-cache"}, sources
    claims = {d["metadata"]["name"] for _, d in k8s_docs if d["kind"] == "PersistentVolumeClaim"}
    for file, workload in _workloads(k8s_docs):
        pod = workload["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        path = env.get("GENAUG_COMPILE_CACHE")
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == path]
        assert not mount.get("readOnly"), f"{file}: the compile cache is written"
        volume = {v["name"]: v for v in pod["volumes"]}[mount["name"]]
        assert volume["persistentVolumeClaim"]["claimName"] == "genaug-compile-cache" in claims
        startup = container["startupProbe"]
        assert startup["httpGet"]["path"] == "/readyz", file
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 600, (
            f"{file}: a cold start (SDXL load and a compiling warm-up) needs 10 minutes or more")


# --- docs -----------------------------------------------------------------------------------


def test_deploy_doc_python_snippets_parse_and_conversion_is_the_command() -> None:
    doc = (ROOT / "docs" / "deploy.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    assert blocks, "docs/deploy.md has no python snippet"
    for block in blocks:
        ast.parse(block)
    # A fine-tuned .pt is converted by the one command that may unpickle, never by a snippet
    # readers would copy with weights_only=False.
    assert "genaug convert-unet" in doc and "--trust-this-file" in doc
    assert "weights_only=False" not in "\n".join(blocks)