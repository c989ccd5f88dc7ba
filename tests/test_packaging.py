"""pyproject.toml declares every folder it ships: setuptools warns "Package would be ignored"
for a folder inside a package that is not itself listed, and a data folder (the status page,
the tiny tokenizer, the weights) must be listed with its package data."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_shipped_folder_is_a_listed_package_with_its_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = set(config["packages"])
    folders = {name: ROOT / where for name, where in config["package-dir"].items()}
    missing = []
    for package in sorted(packages):
        parts = package.split(".")
        base = next(p for p in sorted(folders, key=len, reverse=True)
                    if package == p or package.startswith(p + "."))
        folder = folders[base].joinpath(*parts[len(base.split(".")):])
        assert folder.is_dir(), f"{package} -> {folder} does not exist"
        for child in folder.iterdir():
            if child.is_dir() and child.name != "__pycache__" and any(child.iterdir()):
                if f"{package}.{child.name}" not in packages:
                    missing.append(f"{package}.{child.name}")
        data = [f.name for f in folder.iterdir()
                if f.is_file() and f.suffix != ".py" and f.name != "py.typed"]
        if data:
            assert package in config["package-data"], f"{package} ships {data} undeclared"
    assert missing == [], f"list these in [tool.setuptools] packages: {missing}"
