"""The docker/ tests' files, read once per module: the compose file as written and as
interpolated with .env.example, pyproject.toml, and the Kubernetes manifests."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest
import yaml
from _docker_files import (
    ENV_EXAMPLE,
    K8S,
    ROOT,
    load_compose,
    read_env_file,
    resolve,
)

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


