"""docker/*.Dockerfile, read as Docker reads them: non-root, pinned bases, the health check,
the install of CI's extras and pins, and every COPY present."""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest
from _docker_files import (
    CONSTRAINTS,
    DOCKERFILES,
    ROOT,
    arg_defaults,
    base_images,
    parse_dockerfile,
)
from packaging.requirements import Requirement
from packaging.version import Version

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
