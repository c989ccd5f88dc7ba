"""trainer/'s layers keep their shape: one NVML session, relative imports, and a docstring in
each layer's package naming its modules. (No line count: a file is split where a concept ends.)"""

from __future__ import annotations

import ast
from pathlib import Path

import genaug.trainer

TRAINER = Path(genaug.trainer.__file__).parent


def _modules() -> list[Path]:
    return sorted(TRAINER.rglob("*.py"))


def test_nvml_is_opened_in_one_module() -> None:
    users = sorted(str(p.relative_to(TRAINER)) for p in _modules()
                   if "pynvml" in p.read_text())
    assert users == ["hardware/nvml.py"], users


def test_the_package_imports_itself_relatively() -> None:
    absolute = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (
                    node.module or "").startswith("genaug.trainer"):
                absolute.append(f"{path.relative_to(TRAINER)}:{node.lineno}")
            elif isinstance(node, ast.Import) and any(
                    a.name.startswith("genaug.trainer") for a in node.names):
                absolute.append(f"{path.relative_to(TRAINER)}:{node.lineno}")
    assert not absolute, absolute


def test_every_room_says_what_lives_there() -> None:
    layers = [p for p in TRAINER.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    assert len(layers) >= 3
    for layer in layers:
        doc = ast.get_docstring(ast.parse((layer / "__init__.py").read_text()))
        assert doc, f"{layer.name}/__init__.py has no docstring"
        for module in layer.glob("*.py"):
            if module.name != "__init__.py":
                assert module.name in doc, f"{layer.name}/__init__.py does not name {module.name}"

