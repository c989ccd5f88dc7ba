"""docker/k8s/keda.yaml: the replicas scale on pending pool work, checked without a cluster.

The ScaledObject and its TriggerAuthentication are validated against KEDA's own CRD schemas:
the validators npm's ``@kubernetes-models/keda`` compiles from them (pinned in
tools/keda-schema, installed by ``make install`` into .cache/keda-models), run under node. A
broken copy of each is refused, so the check is shown able to fail. Without node or the
package the tests fail with the fix (``make install``): CI installs both.

The rest reads the manifests together: the trigger's query *is*
:data:`genaug.service.pool.pending.PENDING_SQL` (they cannot drift), the target is the
replicas' StatefulSet, the connection comes from the Secret the replicas read their pool URL
from, and KEDA never makes a replica the StatefulSet's entrypoint would refuse.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml
from _docker_files import K8S, ROOT

from genaug.service.pool.pending import PENDING_SQL

KEDA_MODELS = ROOT / ".cache" / "keda-models"
PACKAGE = KEDA_MODELS / "node_modules" / "@kubernetes-models" / "keda" / "package.json"
FIX = "run `make install` (it installs tools/keda-schema's pinned npm packages; needs node and npm)"

# Reads a JSON list of manifests on stdin; prints, per manifest, null (valid) or the error of
# KEDA's schema validator.
VALIDATE_JS = """
const kinds = {
  ScaledObject: require("@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject").ScaledObject,
  TriggerAuthentication:
    require("@kubernetes-models/keda/keda.sh/v1alpha1/TriggerAuthentication")
      .TriggerAuthentication,
};
const docs = JSON.parse(require("fs").readFileSync(0, "utf8"));
console.log(JSON.stringify(docs.map((doc) => {
  try { new kinds[doc.kind](doc).validate(); return null; }
  catch (error) { return String(error.message); }
})));
"""


def load(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((K8S / name).read_text()) if doc]


@pytest.fixture(scope="module")
def keda() -> dict[str, dict[str, Any]]:
    """keda.yaml's documents by kind."""
    docs = load("keda.yaml")
    by_kind = {doc["kind"]: doc for doc in docs}
    assert sorted(by_kind) == ["ScaledObject", "TriggerAuthentication"], sorted(by_kind)
    return by_kind


@pytest.fixture(scope="module")
def replicas() -> dict[str, Any]:
    """The generators' StatefulSet of statefulset.yaml."""
    (found,) = [d for d in load("statefulset.yaml") if d["kind"] == "StatefulSet"]
    return found


def schema_errors(docs: list[dict[str, Any]]) -> list[str | None]:
    """KEDA's CRD validation of each of ``docs``: None when valid, else the error."""
    node = shutil.which("node")
    if node is None:
        pytest.fail(f"node is not installed, so keda.yaml cannot be checked: {FIX}")
    if not PACKAGE.exists():
        pytest.fail(f"KEDA's schemas are not installed ({PACKAGE} is missing): {FIX}")
    run = subprocess.run([node, "-e", VALIDATE_JS], input=json.dumps(docs), cwd=KEDA_MODELS,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, f"node failed: {run.stderr[-2000:]}; {FIX}"
    errors: list[str | None] = json.loads(run.stdout)
    return errors


def test_keda_yaml_follows_kedas_crd_schemas(keda: dict[str, dict[str, Any]]) -> None:
    docs = [keda["TriggerAuthentication"], keda["ScaledObject"]]
    assert schema_errors(docs) == [None, None]


def test_kedas_schemas_refuse_a_broken_scaled_object_and_trigger_authentication(
    keda: dict[str, dict[str, Any]],
) -> None:
    # The check above is live: what a hand edit gets wrong is refused, each with its field.
    as_text = copy.deepcopy(keda["ScaledObject"])
    as_text["spec"]["minReplicaCount"] = "0"
    no_metadata = copy.deepcopy(keda["ScaledObject"])
    del no_metadata["spec"]["triggers"][0]["metadata"]
    number = copy.deepcopy(keda["ScaledObject"])
    number["spec"]["triggers"][0]["metadata"]["targetQueryValue"] = 600
    no_key = copy.deepcopy(keda["TriggerAuthentication"])
    del no_key["spec"]["secretTargetRef"][0]["key"]
    errors = schema_errors([as_text, no_metadata, number, no_key])
    assert all(errors), errors
    for error, field in zip(errors, ["minReplicaCount", "metadata", "targetQueryValue", "key"],
                            strict=True):
        assert field in str(error), (field, error)


def test_the_trigger_reads_pending_work_with_the_modules_query(
    keda: dict[str, dict[str, Any]],
) -> None:
    (trigger,) = keda["ScaledObject"]["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    assert trigger["metadata"]["query"] == PENDING_SQL  # folded YAML: the very same text
    # KEDA reads its thresholds as strings (its schema: a map of strings).
    target = float(trigger["metadata"]["targetQueryValue"])
    activation = float(trigger["metadata"]["activationTargetQueryValue"])
    assert target >= 1 and 0 <= activation < target, (target, activation)


def test_it_scales_the_replicas_statefulset_from_zero(
    keda: dict[str, dict[str, Any]], replicas: dict[str, Any]
) -> None:
    spec = keda["ScaledObject"]["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                      "name": replicas["metadata"]["name"]}
    assert spec["minReplicaCount"] == 0  # the query needs no replica to answer it
    assert spec["cooldownPeriod"] > 0 and spec["pollingInterval"] > 0
    # A pod genaug-<i> starts with GENAUG_REPLICA=i/GENAUG_REPLICAS, refused for i >= N: KEDA
    # must never make such a pod.
    (container,) = replicas["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    n = int(env["GENAUG_REPLICAS"]["value"])
    assert 1 <= spec["maxReplicaCount"] <= n, (
        f"keda.yaml maxReplicaCount {spec['maxReplicaCount']} exceeds GENAUG_REPLICAS={n} of "
        f"statefulset.yaml: pods genaug-{n}.. would refuse to start; raise GENAUG_REPLICAS")


def test_the_connection_is_the_replicas_own_pool_url(
    keda: dict[str, dict[str, Any]], replicas: dict[str, Any]
) -> None:
    auth = keda["TriggerAuthentication"]
    (trigger,) = keda["ScaledObject"]["spec"]["triggers"]
    assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}
    (container,) = replicas["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    secret = env["GENAUG_POOL_URL"]["valueFrom"]["secretKeyRef"]
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "connection", "name": secret["name"], "key": secret["key"]}]


def test_deploy_md_says_the_manifests_thresholds(keda: dict[str, dict[str, Any]]) -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    match = re.search(r"^### Scaling replicas on pending work\n(.*?)(?=^##)", text, re.M | re.S)
    assert match, "docs/deploy.md has no section 'Scaling replicas on pending work'"
    section = match.group(1)
    spec = keda["ScaledObject"]["spec"]
    metadata = spec["triggers"][0]["metadata"]
    for key, value in [("targetQueryValue", metadata["targetQueryValue"]),
                       ("activationTargetQueryValue", metadata["activationTargetQueryValue"]),
                       ("maxReplicaCount", spec["maxReplicaCount"]),
                       ("cooldownPeriod", spec["cooldownPeriod"]),
                       ("pollingInterval", spec["pollingInterval"])]:
        said = f'`{key}: "{value}"`' if isinstance(value, str) else f"`{key}: {value}`"
        assert said in section, f"docs/deploy.md should say {said}, as keda.yaml does"
    assert "kubectl apply -f docker/k8s/keda.yaml" in section
    assert "genaug_pool_pending_images" in section and "max" in section
