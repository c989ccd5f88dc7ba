"""bench/ keeps one contract: a package run as ``python -m``, every benchmark ``run(argv) ->
dict`` ending in ``main(run)``, no import-path edits, and ``python -m bench --help`` lists them
all. Read from the source: no benchmark is imported or run here (they start services)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from bench.harness import catalogue, families, find

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def test_no_file_in_bench_edits_the_import_path() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sorted(BENCH.rglob("*"))
        if path.is_file() and path.suffix in (".py", ".sh")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "sys.path" in line or "noqa: E402" in line
    ]
    assert not offenders, "\n".join(offenders)


def test_every_family_is_a_package_with_benchmarks() -> None:
    # Beside the families only the harness's own modules: a benchmark lives in its family.
    top = {path.name for path in BENCH.glob("*.py")}
    assert top == {"__init__.py", "__main__.py", "harness.py", "run_all.py", "serve.py",
                   "services.py"}, top
    entries = catalogue()
    assert set(families()) == {"service", "pool", "training", "gain", "gpu"}
    assert {e.family for e in entries} == set(families())
    names = [e.name for e in entries]
    assert len(names) == len(set(names)), names  # `python -m bench NAME` is unambiguous
    assert find("pool_latency").module == "bench.pool.pool_latency"


def _contract_breaches(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    out = []
    runs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
    if not runs:
        out.append("no top-level run(argv)")
    else:
        args = runs[0].args
        if [a.arg for a in args.args] != ["argv"] or len(args.defaults) != 1:
            out.append("run's signature is not run(argv=None)")
        if runs[0].returns is None or "dict" not in ast.unparse(runs[0].returns):
            out.append("run does not return a dict")
    guard = 'if __name__ == "__main__":\n    main(run)'
    if ast.dump(tree.body[-1]) != ast.dump(ast.parse(guard).body[0]):
        out.append(f"does not end with {guard!r}")
    if not ast.get_docstring(tree):
        out.append("no docstring (its first line is what --help lists)")
    return out


def test_every_benchmark_keeps_the_contract() -> None:
    modules = [BENCH / e.family / f"{e.name}.py" for e in catalogue()] + [BENCH / "run_all.py"]
    assert len(modules) >= 19
    breaches = {
        str(path.relative_to(ROOT)): found
        for path in modules
        if (found := _contract_breaches(path))
    }
    assert not breaches, breaches


def test_the_harness_lists_every_benchmark_by_family() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--help"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=True,
    )
    lines = proc.stdout.splitlines()
    for family in families():
        assert any(line.startswith(f"{family}/: ") for line in lines), family
    for entry in catalogue():
        listed = [line for line in lines if line[3:].startswith(entry.name + " ")]
        assert len(listed) == 1, (entry.name, proc.stdout)
    unknown = subprocess.run(
        [sys.executable, "-m", "bench", "no_such_bench"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert unknown.returncode == 2 and "no benchmark 'no_such_bench'" in unknown.stderr


def test_no_gpu_script_imports_another_script() -> None:
    # What the GPU scripts share (the SDXL model, its FLOPs, the drift measures) lives in a
    # library module of bench/gpu/ (a name starting with "_", which the catalogue skips).
    scripts = {e.module for e in catalogue() if e.family == "gpu"}
    offenders = []
    for path in sorted((BENCH / "gpu").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if isinstance(node, ast.ImportFrom) and node.module == "bench.gpu":
                names = [f"bench.gpu.{a.name}" for a in node.names]
            offenders += [f"{path.name}: {name}" for name in names if name in scripts]
    assert not offenders, offenders
