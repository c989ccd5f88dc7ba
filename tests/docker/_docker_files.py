"""Readers of docker/'s files as Docker and compose read them, for tests without an engine.

`docker build` and `docker compose up` cannot run where the tests run, so the tests read the
files the way the tools do: a Dockerfile's instructions (continuations joined, comments
dropped, build-arg defaults substituted), compose's interpolation (``${X:-d}``, ``${X:?e}``,
nesting), an env file, mounts in short or long syntax, and where a path inside a container
comes from on the host: a bind mount's source, a named volume, or what the Dockerfile COPYs
into the image. tests/docker/test_compose.py, test_dockerfiles.py, test_k8s.py,
test_compose_cpu.py and test_compose_install.py share them.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "docker-compose.yml"
ENV_EXAMPLE = DOCKER / ".env.example"
K8S = DOCKER / "k8s"
CONSTRAINTS = ROOT / "constraints" / "cpu.txt"
DOCKERFILES = {
    "service": DOCKER / "service.Dockerfile",
    "trainer": DOCKER / "trainer.Dockerfile",
}
#: The compose service of the CPU profile (docs/deploy.md, "Try it on a CPU").
CPU_SERVICE = "cpu"


# --- parsers --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, ...
    args: str  # continuation lines joined with single spaces
    line: int  # 1-based line of the instruction's first line


def parse_dockerfile(path: Path) -> list[Instruction]:
    """Instructions of a Dockerfile, continuation lines joined, comments dropped.

    Follows the builder: a trailing backslash continues the instruction, and comment lines
    (also those inside a continued instruction) are removed before joining.
    """
    out: list[Instruction] = []
    parts: list[str] = []
    start = 0
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        stripped = raw.strip()
        if not parts and (not stripped or stripped.startswith("#")):
            continue
        if parts and stripped.startswith("#"):
            continue
        if not parts:
            start = number
        continued = stripped.endswith("\\")
        parts.append(stripped[:-1].strip() if continued else stripped)
        if not continued:
            text = " ".join(p for p in parts if p)
            keyword, _, args = text.partition(" ")
            out.append(Instruction(keyword.upper(), args.strip(), start))
            parts = []
    assert not parts, f"{path.name}: the last instruction ends with a dangling backslash"
    return out


def arg_defaults(instructions: list[Instruction]) -> dict[str, str]:
    """ARG defaults declared before the first FROM (the ones FROM may use)."""
    defaults: dict[str, str] = {}
    for ins in instructions:
        if ins.keyword == "FROM":
            break
        if ins.keyword == "ARG":
            name, _, value = ins.args.partition("=")
            defaults[name.strip()] = value.strip().strip('"')
    return defaults


def base_images(path: Path) -> list[str]:
    """Every FROM image with its build-arg defaults substituted."""
    instructions = parse_dockerfile(path)
    args = arg_defaults(instructions)

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in args, f"{path.name}: FROM uses ${name} without an ARG default before it"
        return args[name]

    images = []
    for ins in instructions:
        if ins.keyword == "FROM":
            image = ins.args.split()[0]
            if image.startswith("--platform"):
                image = ins.args.split()[1]
            images.append(re.sub(r"\$\{(\w+)\}|\$(\w+)", substitute, image))
    return images


VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def interpolate(text: str, env: Mapping[str, str], seen: set[str] | None = None) -> str:
    """Compose-style interpolation: $VAR, ${VAR}, ${VAR:-d}, ${VAR-d}, ${VAR:?e}, ${VAR:+r}.

    Nested defaults (``${A:-${B}}``) are supported; ``$$`` is a literal ``$``. Names met are
    added to ``seen``. A required variable that is missing raises KeyError.
    """
    seen = set() if seen is None else seen
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "$":
            out.append(c)
            i += 1
            continue
        if text.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        if text.startswith("${", i):
            depth, j = 1, i + 2
            while depth:
                assert j < len(text), f"unclosed ${{ in {text!r}"
                if text.startswith("${", j):
                    depth, j = depth + 1, j + 2
                    continue
                depth += {"{": 0, "}": -1}.get(text[j], 0)
                j += 1
            inner = text[i + 2 : j - 1]
            name_match = VAR_NAME.match(inner)
            assert name_match, f"bad variable reference ${{{inner}}} in {text!r}"
            name = name_match.group()
            rest = inner[len(name) :]
            seen.add(name)
            value = env.get(name)
            op = next((o for o in (":-", ":?", ":+", "-", "?", "+") if rest.startswith(o)), "")
            assert op or not rest, f"unknown operator in ${{{inner}}}"
            word = interpolate(rest[len(op) :], env, seen) if op else ""
            if op in (":-", "-"):
                use_default = not value if op == ":-" else value is None
                out.append(word if use_default else str(value))
            elif op in (":?", "?"):
                if not value if op == ":?" else value is None:
                    raise KeyError(f"{name} is required: {word}")
                out.append(str(value))
            elif op in (":+", "+"):
                out.append(word if (value if op == ":+" else value is not None) else "")
            else:
                out.append(value or "")
            i = j
            continue
        name_match = VAR_NAME.match(text, i + 1)
        if name_match:
            seen.add(name_match.group())
            out.append(env.get(name_match.group(), ""))
            i = name_match.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


class EveryVariableSet(Mapping[str, str]):
    """An environment in which every variable is set: interpolation then visits all names."""

    def __getitem__(self, key: str) -> str:
        return "x"

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def walk_strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, Mapping):
        for value in node.values():
            yield from walk_strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk_strings(value)


def resolve(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, Mapping):
        return {k: resolve(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [resolve(v, env) for v in node]
    return node


def read_env_file(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        assert sep and VAR_NAME.fullmatch(name), f"{path.name}:{number}: not NAME=value: {raw!r}"
        assert name not in env, f"{path.name}:{number}: {name} is set twice"
        env[name] = value.strip().strip("\"'")
    return env


@dataclass(frozen=True)
class Mount:
    type: str
    source: str
    target: str
    read_only: bool
    # compose makes a missing bind source folder (implied by the short syntax); without it,
    # a missing source stops `up` ("bind source path does not exist").
    create_host_path: bool = False


def mounts(service: Mapping[str, Any], top_volumes: Mapping[str, Any]) -> list[Mount]:
    """Volume entries of a compose service, short or long syntax, normalized."""
    out = []
    for entry in service.get("volumes", []):
        if isinstance(entry, str):
            fields = entry.split(":")
            source, target = fields[0], fields[1]
            options = fields[2].split(",") if len(fields) > 2 else []
            kind = "volume" if source in top_volumes else "bind"
            out.append(Mount(kind, source, target, "ro" in options, kind == "bind"))
        else:
            out.append(
                Mount(
                    entry["type"],
                    str(entry.get("source", "")),
                    entry["target"],
                    bool(entry.get("read_only", False)),
                    bool((entry.get("bind") or {}).get("create_host_path", False)),
                )
            )
    return out


def load_compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict) and "services" in data, f"{COMPOSE} has no services"
    return data


def required_variables(node: Any) -> set[str]:
    """Names compose refuses to run without: ``${X:?...}`` and ``${X?...}``."""
    names: set[str] = set()
    for text in walk_strings(node):
        names.update(re.findall(r"\$\{(" + VAR_NAME.pattern + r"):?\?", text))
    return names


def image_env(kind: str) -> dict[str, str]:
    """The ENV a Dockerfile bakes into its image (``ENV A=1 B=2`` and ``ENV A 1``)."""
    env: dict[str, str] = {}
    for ins in parse_dockerfile(DOCKERFILES[kind]):
        if ins.keyword != "ENV":
            continue
        words = shlex.split(ins.args)
        if words and "=" not in words[0]:
            env[words[0]] = " ".join(words[1:])
            continue
        for word in words:
            name, _, value = word.partition("=")
            env[name] = value
    return env


def image_copies(kind: str) -> dict[PurePosixPath, Path]:
    """What a Dockerfile COPYs: each destination in the image and its source in the repo.

    A relative destination is under the WORKDIR in force; ``COPY a/ /x/`` puts a's content
    at /x (the folder itself is not nested), so both map folder to folder.
    """
    out: dict[PurePosixPath, Path] = {}
    workdir = PurePosixPath("/")
    for ins in parse_dockerfile(DOCKERFILES[kind]):
        if ins.keyword == "WORKDIR":
            workdir = workdir / ins.args.strip()
        if ins.keyword != "COPY":
            continue
        words = [w for w in shlex.split(ins.args) if not w.startswith("--")]
        *sources, dest = words
        target = workdir / dest
        for source in sources:
            if len(sources) > 1 or dest.endswith("/") and not source.endswith("/"):
                out[target / PurePosixPath(source).name] = ROOT / source
            else:
                out[target] = ROOT / source
    return out


@dataclass(frozen=True)
class HostPath:
    """Where a path inside a container comes from."""

    kind: str  # "bind" (a host path), "volume" (a named volume) or "image" (COPY) or "none"
    path: Path | None  # the host or repo path for "bind" and "image"
    mount: Mount | None  # the mount holding it, for "bind" and "volume"


def mounts_holding(
    path: str | PurePosixPath, service: Mapping[str, Any], top_volumes: Mapping[str, Any]
) -> list[Mount]:
    """The mounts of ``service`` that hold ``path`` (a path inside its container)."""
    inside = PurePosixPath(path)
    return [m for m in mounts(service, top_volumes) if inside.is_relative_to(m.target)]


def container_to_host(
    path: str, service: Mapping[str, Any], top_volumes: Mapping[str, Any], *, image: str
) -> HostPath:
    """Map ``path`` in a running ``service`` (its compose definition, interpolated) to its
    origin: the deepest mount holding it, else the image's COPY that put it there.

    Relative bind sources are relative to the compose file's folder, as compose reads them.
    """
    inside = PurePosixPath(path)
    holding = mounts_holding(inside, service, top_volumes)
    if holding:
        mount = max(holding, key=lambda m: len(m.target))
        rel = inside.relative_to(mount.target)
        if mount.type == "bind":
            return HostPath("bind", (COMPOSE.parent / mount.source / rel).resolve(), mount)
        return HostPath(mount.type, None, mount)
    return image_to_repo(path, image=image)


def image_to_repo(path: str, *, image: str) -> HostPath:
    """The repo file a path in the image was copied from, or kind "none"."""
    inside = PurePosixPath(path)
    copies = [(d, s) for d, s in image_copies(image).items() if inside.is_relative_to(d)]
    if not copies:
        return HostPath("none", None, None)
    dest, source = max(copies, key=lambda c: len(str(c[0])))
    return HostPath("image", source / inside.relative_to(dest), None)


def lora_paths(value: str) -> list[str]:
    """The paths of a GENAUG_LORAS value, split as service/settings/values.py splits it."""
    from genaug.service.settings import Settings

    return [str(p) for p in Settings(loras=value).loras.values()]
