"""genaug.torch as installed: its extra pulls no TensorFlow, it imports none, and neither its
name nor its files shadow the real ``torch``."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _requirements(extra: str, extras: dict[str, list[str]]) -> set[str]:
    """Every requirement ``genaug[extra]`` brings, its own extras followed."""
    out: set[str] = set()
    for req in extras[extra]:
        inner = re.fullmatch(r"genaug\[(.+)\]", req.strip())
        if inner:
            for name in inner.group(1).split(","):
                out |= _requirements(name.strip(), extras)
        else:
            out.add(re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower())
    return out


def test_the_torch_extra_pulls_torch_and_the_client_and_no_tensorflow() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    needs = _requirements("torch", extras)
    assert {"torch", "httpx", "numpy"} <= needs
    assert not {n for n in needs if n.startswith(("tensorflow", "keras", "tf-"))}, needs


def test_genaug_torch_imports_no_tensorflow_and_the_real_torch(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "sys.modules['tensorflow'] = None; sys.modules['keras'] = None  # an import fails\n"
        "import genaug.torch as gt\n"
        "from genaug.torch import MixedDataset, PoolDataset, class_need, diagnose\n"
        "from genaug.torch import dataset, stream\n"
        "import torch\n"
        "assert dataset.torch is torch and torch.__file__.endswith("
        "('site-packages/torch/__init__.py', 'dist-packages/torch/__init__.py')), "
        "torch.__file__\n"
        "assert hasattr(torch, 'nn') and gt.__name__ == 'genaug.torch'\n"
        "print('ok')\n")
    for cwd in (ROOT, ROOT / "torchfeed", tmp_path):  # a script run from the package's folder
        done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.strip() == "ok", (cwd, done.stderr[-2000:])


def test_no_file_of_the_package_is_named_like_what_it_imports() -> None:
    names = {p.stem for p in (ROOT / "torchfeed").glob("*.py")}
    assert not names & {"torch", "numpy", "httpx", "genaug", "tensorflow"}, names
