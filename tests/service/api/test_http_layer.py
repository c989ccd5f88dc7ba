"""The HTTP layer stays light: importing every module of the edge (``genaug.service.api``),
the intake and the app loads no torch, diffusers or transformers; those load with the model,
in the lifespan."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import genaug.service.api
import genaug.service.intake


def test_importing_the_http_layer_does_not_import_torch() -> None:
    modules = ["genaug.service.app", "genaug.service.errors"] + [
        info.name
        for package in (genaug.service.api, genaug.service.intake)
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + ".")
    ]
    assert "genaug.service.api.router" in modules and "genaug.service.api.fastpath" in modules
    code = (
        f"import importlib, sys\nfor name in {modules!r}:\n    importlib.import_module(name)\n"
        "print(sorted(m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
