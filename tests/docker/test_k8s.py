"""docker/k8s/, validated as the API would (kubernetes-validate, strict) and pinned where no
schema can say: probes, GPUs, security, the pool's storage, selectors, mounts and the compile
cache's volume."""

from __future__ import annotations

import copy
import re
from pathlib import PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
from _compose import (
    serving_services,
)
from _docker_files import (
    image_to_repo,
    lora_paths,
    mounts,
)

# --- Kubernetes -----------------------------------------------------------------------------

#: The Kubernetes release the manifests are validated against (kubernetes-validate's newest).
K8S_VERSION = "1.37.0"


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
        if svc["environment"].get("GENAUG_ROLE") == "api":
            continue  # loads no model: compiles nothing
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


def test_the_api_holds_no_model_and_the_workers_it_forwards_to_scale_from_zero(
        k8s_docs: list[tuple[str, dict[str, Any]]]) -> None:
    """api.yaml: two api replicas without a GPU on the workers' pool and recipes; the
    workers (statefulset.yaml) announce their stable names and KEDA scales them from 0."""
    by_kind = {(d["kind"], d["metadata"]["name"]): d for _, d in k8s_docs}
    api = by_kind[("Deployment", "genaug-api")]
    workers = by_kind[("StatefulSet", "genaug")]
    assert api["spec"]["replicas"] == 2
    (container,) = api["spec"]["template"]["spec"]["containers"]
    (worker,) = workers["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    worker_env = {e["name"]: e for e in worker["env"]}
    assert env["GENAUG_ROLE"]["value"] == "api" and worker_env["GENAUG_ROLE"]["value"] == "worker"
    resources = container["resources"]
    assert not any("gpu" in key for part in resources.values() for key in part), resources
    for name in ("GENAUG_POOL_URL", "GENAUG_API_KEYS"):
        assert env[name]["valueFrom"] == worker_env[name]["valueFrom"], name
    assert env["GENAUG_RECIPES"]["value"] == worker_env["GENAUG_RECIPES"]["value"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    service = by_kind[("Service", "genaug-api")]
    assert service["spec"]["selector"] == api["spec"]["selector"]["matchLabels"]
    assert "GENAUG_ADVERTISE_URL=\"http://${HOSTNAME}.genaug-headless:8000\"" in " ".join(
        worker["args"])
    scaled = next(d for _, d in k8s_docs if d["kind"] == "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == workers["metadata"]["name"]
    assert scaled["spec"]["minReplicaCount"] == 0 and scaled["spec"]["cooldownPeriod"] > 0
