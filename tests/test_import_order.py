"""The packages keep their layer order: imports point down one order, and no module imports
itself back.

docs/architecture.md draws service/'s layers; this test is the rule it states. Every import of a
``genaug.service`` module (type-only imports under ``TYPE_CHECKING`` included) must go to a
layer *below* its own in :data:`ORDER`; the packages beside service/ keep their own fences
(:data:`FENCES`); and the module graph of the whole package has no circle. An arrow that runs
back up fails here, naming the file and the import.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

from genaug.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
#: Top-level folders and the import names pyproject.toml maps them to.
PACKAGES = {"genaug": "genaug", "service": "genaug.service", "client": "genaug.client",
            "feeding": "genaug.feeding", "trainer": "genaug.trainer", "torchfeed": "genaug.torch"}

#: service/'s layers from the top down: each imports only layers below it. The wiring (test
#: support, the commands, adapt (``genaug adapt``'s work: it uses the pipeline and the judge),
#: the app factory) sits on top; the HTTP edge next; then jobs (a fill handed off, its webhook:
#: above the pool, where jobs are stored); then the pool, which
#: plans with intake's plan and stores what the pipeline made, then the judge, which scores it
#: before the pool stores it; the request's own way below it
#: (intake, then the pipeline); and at the bottom the vocabulary every layer shares: recipes,
#: settings (the package: the fields, how an invalid one is said, the parsers of its composite
#: values, the ``notify_url`` rule that the settings, the intake and the webhooks share),
#: sampling (which sampler draws a label: the speed modes, a request's, a recipe's, the
#: pool's and the pipeline's words, and ``auto``'s choice over records the store keeps),
#: batching (``items.py``, the queue, the batcher), errors and metrics.
ORDER = ("testing", "__main__", "commands", "adapt", "app", "api", "jobs", "pool", "judge",
         "intake", "pipeline", "recipes", "settings", "sampling", "batching", "errors",
         "metrics")

#: trainer/'s layers from the top down, the same way: the reference trainer, the checks,
#: feeding, and at the bottom the hardware and the reservoir's mixing (the package's
#: ``__init__`` re-exports them all and is left out).
TRAINER_ORDER = ("reference", "checks", "feeding", "hardware", "mixing")

#: The packages whose layers keep an order, and that order.
ORDERS = {"genaug.service": ORDER, "genaug.trainer": TRAINER_ORDER}

#: What the packages beside service/ may import of genaug (prefixes).
FENCES = {
    "genaug.client": ("genaug.client", "genaug.wire", "genaug.job_states", "genaug.urls"),
    # Feeding, shared by both trainers: the client and the base, no trainer.
    "genaug.feeding": ("genaug.feeding", "genaug.client", "genaug.wire", "genaug.urls",
                       "genaug.mixing", "genaug.match", "genaug"),
    "genaug.trainer": ("genaug.trainer", "genaug.feeding", "genaug.client", "genaug.wire",
                       "genaug.digits", "genaug.local_service", "genaug.urls", "genaug.flags",
                       "genaug.mixing", "genaug.match", "genaug"),
    # PyTorch trainers: the client and the shared feeding, never the TensorFlow trainer.
    "genaug.torch": ("genaug.torch", "genaug.feeding", "genaug.client", "genaug.wire",
                     "genaug.urls", "genaug.mixing", "genaug.match", "genaug"),
}

#: genaug/'s base: what every package beside it may import (the wire format, the digits,
#: the child-process helper). It imports nothing of genaug but itself, never service/,
#: trainer/, client/ or genaug/'s top.
BASE = ("genaug", "genaug.wire", "genaug.job_states", "genaug.digits", "genaug.local_service",
          "genaug.urls", "genaug.flags", "genaug.mixing", "genaug.match")
#: genaug/'s top: the command table, the doctor, the jobs command and the experiments. They
#: use everything; nothing of service/, trainer/ or client/ imports them (the fences above and
#: below).
TOP = ("genaug.cli", "genaug.doctor", "genaug.jobs", "genaug.experiments", "genaug.gain")
#: The top's modules elsewhere: each command's module (``genaug.cli.COMMANDS`` names them) and
#: ``python -m genaug.service``, which is ``genaug serve``.
TOP_ELSEWHERE = ("genaug.service.__main__",
                  *(e.module for e in COMMANDS.values() if not e.module.startswith(TOP)))


def _modules() -> dict[str, Path]:
    found = {}
    for folder, name in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([name, *parts])] = path
    return found


def _imports(module: str, path: Path, *, own: bool = True) -> list[tuple[str, int]]:
    """``(imported module, line)`` for every genaug import in ``path`` (every import with
    ``own=False``), relative ones resolved."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from . import x` may name a module: count it as that module
            out += [(f"{target}.{alias.name}", node.lineno) for alias in node.names]
    return [(t, line) for t, line in out if not own or t == "genaug" or t.startswith("genaug.")]


def _resolve(target: str, modules: dict[str, Path]) -> str | None:
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def _layer(module: str, package: str) -> str | None:
    """The layer (first folder or module below ``package``) that ``module`` lives in."""
    parts, top = module.split("."), package.split(".")
    return parts[len(top)] if parts[: len(top)] == top and len(parts) > len(top) else None


@pytest.mark.parametrize("package", sorted(ORDERS))
def test_imports_point_down_the_layers(package: str) -> None:
    order = ORDERS[package]
    modules = _modules()
    layers = {r for m in modules if (r := _layer(m, package))}
    missing = layers - set(order)
    assert not missing, f"layers missing from the order (place them): {missing}"
    wrong = []
    for module, path in modules.items():
        here = _layer(module, package)
        if here is None:
            continue
        for target, line in _imports(module, path):
            there = _layer(_resolve(target, modules) or "", package)
            if there is None or there == here:
                continue
            if order.index(there) < order.index(here):
                wrong.append(f"{path.relative_to(ROOT)}:{line} ({here}) imports {target} "
                             f"({there}, above it)")
    assert wrong == [], "imports that point up the layers:\n" + "\n".join(wrong)


def test_packages_beside_the_service_keep_their_fences() -> None:
    modules = _modules()
    wrong = []
    for module, path in modules.items():
        package = ".".join(module.split(".")[:2])
        allowed = FENCES.get(package)
        if allowed is None:
            continue
        for target, line in _imports(module, path):
            resolved = _resolve(target, modules) or target
            if not any(resolved == a or (a != "genaug" and resolved.startswith(a + "."))
                       for a in allowed):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert wrong == [], "imports across a package fence:\n" + "\n".join(wrong)


#: A query of the ``jobs`` table (the schema's DDL and upgrades, ``CREATE``/``ALTER TABLE``,
#: are the store's and not queries).
_JOBS_QUERY = re.compile(r"\b(FROM|INTO|UPDATE|JOIN)\s+jobs\b", re.IGNORECASE)


#: The layers of service/ that speak HTTP: the edge, the app that mounts it, the test support
#: and the intake, which reads a request's body. The rest raise the domain errors of
#: ``service/errors.py`` and the edge maps them to statuses (``service/api/errors.py``).
HTTP_LAYERS = ("api", "app", "testing", "intake")


def test_below_the_edge_no_module_imports_a_web_framework() -> None:
    wrong = []
    for module, path in _modules().items():
        if module.startswith("genaug.service.") and _layer(module, "genaug.service") not in (
                HTTP_LAYERS):
            wrong += [f"{path.relative_to(ROOT)}:{line} imports {target}"
                      for target, line in _imports(module, path, own=False)
                      if target.split(".")[0] in ("starlette", "fastapi")]
    assert wrong == [], "HTTP below the edge (raise a genaug.service.errors error):\n" + (
        "\n".join(wrong))


def test_the_fill_job_lives_in_one_layer() -> None:
    """service/jobs/ holds the fill-job feature; pool/ is the database and the planning: no
    module of pool/ is about jobs, none queries the jobs table, and none imports jobs/ (the
    order above says so too)."""
    pool = ROOT / "service" / "pool"
    named = sorted(p.name for p in pool.rglob("*.py") if "job" in p.name)
    assert named == [], f"job modules in service/pool/ (they belong in service/jobs/): {named}"
    queries = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
               for path in sorted(pool.rglob("*.py"))
               for n, line in enumerate(path.read_text().splitlines(), 1)
               if _JOBS_QUERY.search(line)]
    assert queries == [], "queries of the jobs table in service/pool/:\n" + "\n".join(queries)


def test_no_import_circles() -> None:
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        for target, _ in _imports(module, path):
            resolved = _resolve(target, modules)
            if resolved and resolved != module:
                graph[module].add(resolved)
    # Tarjan's strongly connected components: a component of two or more is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(modules):
        if module not in index:
            visit(module)
    assert circles == [], f"import circles: {circles}"


def test_genaugs_base_imports_only_the_base() -> None:
    modules = _modules()
    wrong = []
    for module in BASE:
        path = modules[module]
        for target, line in _imports(module, path):
            if (_resolve(target, modules) or target) not in BASE:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert wrong == [], "genaug/'s base imports above itself:\n" + "\n".join(wrong)


def test_every_module_of_genaug_is_base_or_top_and_the_top_is_fenced_off() -> None:
    modules = _modules()
    top = {".".join(m.split(".")[:2]) for m in modules if m.split(".")[:2][-1] not in
           {"service", "client", "feeding", "trainer", "torch"}}
    assert top == set(BASE) | set(TOP), (
        f"place these in BASE or TOP (and in docs/architecture.md): "
        f"{top ^ (set(BASE) | set(TOP))}")
    wrong = []
    for module, path in modules.items():
        if (module.startswith(("genaug.service", "genaug.client", "genaug.feeding",
                               "genaug.trainer", "genaug.torch"))
                and module not in TOP_ELSEWHERE):
            for target, line in _imports(module, path):
                resolved = _resolve(target, modules) or target
                if any(resolved == r or resolved.startswith(r + ".") for r in TOP):
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert wrong == [], "imports of genaug/'s top from below it:\n" + "\n".join(wrong)
    doc = (ROOT / "docs" / "architecture.md").read_text()
    for kind, names in (("base", BASE[1:]), ("top", TOP)):
        row = next((r for r in doc.splitlines() if r.startswith(f"| `genaug/` {kind}")), "")
        missing = [n for n in names if f"`{n.split('.')[-1]}" not in row]
        assert row and not missing, f"docs/architecture.md's genaug/ {kind} row lacks {missing}"
