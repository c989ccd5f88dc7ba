"""service.Dockerfile's install steps, run outside Docker in a fresh virtual environment.

No engine builds the image here, so the test does what the build does, step by step: a build
context holding exactly what the Dockerfile COPYs (so a file the install needs but the
Dockerfile forgets fails here), an interpreter with the base image's torch already installed
(pytorch/pytorch:TORCH_VERSION-...; here the CPU build of the same version), then every
command of the RUN that installs, as written (build args substituted, ``python`` being the
fresh environment's). One difference, named where it is made: the base image's torch is a
CUDA build, this one is not, so the build's ``torch.version.cuda`` check is read as true.
Finally the image's CMD, ``genaug serve``, answers ``--help`` from that environment.

Minutes (a fresh environment with torch and diffusers): marked slow.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
from _docker_files import DOCKERFILES, arg_defaults, image_copies, parse_dockerfile

WORKDIR = PurePosixPath("/opt/genaug/src")
#: The build's check that torch is a CUDA build, and what it becomes on this CPU machine.
CUDA_CHECK = ("and torch.version.cuda", "and True")


def _build_context(tmp: Path) -> Path:
    """What the Dockerfile COPYs under its WORKDIR, laid out as in the image."""
    context = tmp / "context"
    for dest, source in image_copies("service").items():
        if not dest.is_relative_to(WORKDIR):
            continue  # recipes/ goes to /opt/genaug/recipes: not part of the install
        target = context / dest.relative_to(WORKDIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    return context


def _install_commands() -> list[list[str]]:
    """The commands of the RUN that pip-installs, split at ``&&``, build args substituted."""
    instructions = parse_dockerfile(DOCKERFILES["service"])
    args = arg_defaults(instructions)
    runs = [i for i in instructions if i.keyword == "RUN" and "pip install" in i.args]
    assert len(runs) == 1, f"expected one installing RUN, found {len(runs)}"
    text = runs[0].args
    for name, value in args.items():
        text = text.replace("${" + name + "}", value)
    commands: list[list[str]] = [[]]
    for word in shlex.split(text):
        if word == "&&":
            commands.append([])
        else:
            commands[-1].append(word)
    return commands


@pytest.mark.slow
@pytest.mark.timeout(900)  # 4-5 minutes on 2 shared cores, most of it pip
def test_service_image_install_steps_in_a_fresh_venv(tmp_path: Path) -> None:
    context = _build_context(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    torch = arg_defaults(parse_dockerfile(DOCKERFILES["service"]))["TORCH_VERSION"]
    # The base image: torch TORCH_VERSION is installed before the Dockerfile's own steps.
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", f"torch=={torch}"],
                   check=True, env=env, cwd=context)

    commands = _install_commands()
    assert commands[0][:4] == ["python", "-m", "pip", "install"], commands[0]
    for command in commands:
        assert command[0] == "python", f"a RUN step this test cannot replay: {command}"
        if command[1] == "-c" and CUDA_CHECK[0] in command[2]:
            command = [command[0], "-c", command[2].replace(*CUDA_CHECK)]
        done = subprocess.run([str(python), *command[1:]], env=env, cwd=context,
                              capture_output=True, text=True)
        assert done.returncode == 0, (
            f"`{shlex.join(command)}` failed ({done.returncode}):\n"
            f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    assert any(CUDA_CHECK[0] in c[-1] for c in commands), (
        "service.Dockerfile no longer checks torch.version.cuda: update CUDA_CHECK"
    )

    # The image's CMD from the installed entry point, outside the source tree.
    helped = subprocess.run([str(venv / "bin" / "genaug"), "serve", "--help"], env=env,
                            cwd=tmp_path, capture_output=True, text=True)
    assert helped.returncode == 0 and "--host" in helped.stdout, helped.stderr[-2000:]
    # The install is a wheel built from the context, not a link back to the checkout.
    where = subprocess.run(
        [str(python), "-c", "import genaug.service as s; print(s.__file__)"],
        env=env, cwd=tmp_path, capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert where.startswith(str(venv)), where
