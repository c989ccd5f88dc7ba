"""docker/docker-compose.yml, checked without an engine: profiles, GPU sets that never
overlap, healthy generators before trainers, the pool on a named volume, read-only weights,
adapters and shots, loopback ports, every variable documented, and the Compose
Specification's schema (check-jsonschema's copy)."""

from __future__ import annotations

import copy
import importlib.resources
import json
import re
from collections.abc import Mapping
from itertools import combinations
from pathlib import PurePosixPath
from typing import Any

import jsonschema
import pytest
import yaml
from _compose import (
    GENERATOR,
    RUN_TOGETHER,
    YOUR_FOLDERS,
    command_option,
    generator_services,
    gpu_ids,
    serving_services,
    trainer_services,
)
from _docker_files import (
    CPU_SERVICE,
    DOCKER,
    ENV_EXAMPLE,
    ROOT,
    EveryVariableSet,
    Mount,
    container_to_host,
    image_to_repo,
    interpolate,
    lora_paths,
    mounts,
    mounts_holding,
    required_variables,
    resolve,
    walk_strings,
)

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


def test_split_profile_is_an_api_without_a_model_and_a_worker_on_one_postgres_pool(
    resolved: dict[str, Any], env_example: dict[str, str]
) -> None:
    """``--profile split``: the api (no model, no GPU, the published port) and a CPU worker
    share the postgres pool; the api never waits for the worker (it answers at zero)."""
    services = resolved["services"]
    split = sorted(n for n, s in services.items() if "split" in s.get("profiles", []))
    assert split == ["postgres", "split-api", "split-worker"], split
    api, worker = services["split-api"], services["split-worker"]
    url = f"postgresql://genaug:{env_example['GENAUG_DB_PASSWORD']}@postgres:5432/genaug"
    for name, svc, role in (("split-api", api, "api"), ("split-worker", worker, "worker")):
        env = svc["environment"]
        assert env["GENAUG_ROLE"] == role and env["GENAUG_POOL_URL"] == url, (name, env)
        assert "GENAUG_POOL_PATH" not in env and not gpu_ids(svc), name
        assert svc["depends_on"]["postgres"]["condition"] == "service_healthy", name
    assert api["environment"]["GENAUG_RECIPES"] == worker["environment"]["GENAUG_RECIPES"]
    assert "GENAUG_MODEL" not in api["environment"]
    assert (worker["environment"]["GENAUG_MODEL"], worker["environment"]["GENAUG_DEVICE"]) == (
        "tiny-digits", "cpu")
    assert worker["environment"]["GENAUG_ADVERTISE_URL"] == "http://split-worker:8000"
    assert api.get("ports") and not worker.get("ports"), "the api is the one address"
    assert "split-worker" not in api["depends_on"], "the api must start at zero workers"
