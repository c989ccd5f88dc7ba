"""The docs move with the code: docs/settings.md's table and docs/api.md's route table match
the service, and every relative link of the README and the docs lands on a file and a
heading that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from genaug.service.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SETTINGS_PAGE = ROOT / "docs" / "settings.md"
API_PAGE = ROOT / "docs" / "api.md"


def test_every_setting_is_in_the_settings_table() -> None:
    rows = set(re.findall(r"^\| `(GENAUG_[A-Z_]+)` \|", SETTINGS_PAGE.read_text(), flags=re.M))
    fields = {f"GENAUG_{name.upper()}" for name in Settings.model_fields}
    assert fields - rows == set(), "settings missing from docs/settings.md"
    assert rows - fields == set(), "docs/settings.md lists settings that do not exist"
    assert "](docs/settings.md)" in README, "the README no longer links the settings"


def test_every_setting_has_a_description() -> None:
    assert [n for n, f in Settings.model_fields.items() if not f.description] == []


def test_every_route_is_in_the_api_page(make_service: Any, shapes_recipes_file: Path,
                                        tmp_path: Path) -> None:
    """Each method and path the schema serves (with a recipe, so the recipe routes are there)
    is a `METHOD /path` cell of docs/api.md's table, and the table names no route the service
    lacks."""
    import httpx

    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pregenerate=False)
    spec = httpx.get(live.url + "/openapi.json").json()
    # the schema writes one path per configured recipe (names are an enum); the page, one
    served = {(method.upper(), path.replace("/v1/recipes/shapes", "/v1/recipes/{name}"))
              for path, ops in spec["paths"].items() for method in ops}
    table = "\n".join(line for line in API_PAGE.read_text().splitlines()
                      if line.startswith("| `"))
    listed = set(re.findall(r"`(GET|POST|PUT|PATCH|DELETE) (/[^`\s]*)`", table))
    assert served - listed == set(), "routes missing from docs/api.md's table"
    # served, but not API routes in the schema
    pages = {("GET", "/"), ("GET", "/docs"), ("GET", "/pool/{name}")}
    assert listed - served - pages == set(), "docs/api.md lists routes the service lacks"


def test_cli_help_lists_the_commands() -> None:
    out = subprocess.run([sys.executable, "-m", "genaug.cli", "--help"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    for command in ("serve", "demo", "pregenerate", "export", "train", "doctor"):
        assert command in out


def test_readme_commands_exist_in_the_makefile() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "make demo" in README and "make test" in README
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


LINKED_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
                ROOT / "bench" / "README.md", ROOT / "examples" / "README.md"]


def broken_links(pages: dict[Path, str]) -> list[str]:
    """The relative links of ``pages`` (path -> text) whose file or folder does not exist, or
    whose anchor is no heading of the page it names. Links to a scheme (``https:``,
    ``mailto:``) are not checked; an anchor only on the pages given."""
    anchors = {page.resolve(): {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}
               for page, text in pages.items()}
    broken = []
    for page, text in pages.items():
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue
            linked = (page.parent / target).resolve() if target else page.resolve()
            where = f"{page.relative_to(ROOT)}: {target}" + (f"#{anchor}" if anchor else "")
            if not linked.exists():
                broken.append(where)
            elif anchor and linked in anchors and anchor not in anchors[linked]:
                broken.append(where)
    return broken


def test_links_between_the_docs_land_on_a_file_and_a_heading() -> None:
    assert broken_links({page: page.read_text() for page in LINKED_PAGES}) == []


@pytest.mark.parametrize(("right", "wrong"), [
    ("](docs/settings.md)", "](docs/setting.md)"),                 # a file that is not there
    ("](docs/trainer.md#in-a-pytorch-trainer)", "](docs/trainer.md#in-pytorch)"),  # an anchor
])
def test_a_broken_link_is_named(right: str, wrong: str) -> None:
    """The check above can fail: the README with one link changed is caught on that link."""
    readme = ROOT / "README.md"
    assert right in README, f"{right!r} is no longer in README.md: pick another"
    pages = {page: page.read_text() for page in LINKED_PAGES}
    pages[readme] = README.replace(right, wrong, 1)
    assert broken_links(pages) == [f"README.md: {wrong[2:-1]}"]


# A path docs/architecture.md names: a backticked name with a folder or a file suffix
# (`service/pool/targets.py`, `trainer/feeding/`, `plan.py`), or a bare one under a top folder
# (bench/pool/need_fill_rate.py). Placeholders (`tests/service/<layer>/`, `DATA/<label>/*`),
# routes (`/v1/variants`) and module names (`genaug.wire`: checked apart) are not paths.
_REST = r"(?:/[\w.-]+)*(?:/|\.(?:py|md|yaml|yml|toml|json|txt|ipynb))"
_PATH = r"[A-Za-z_][\w.-]*" + _REST
_TOP = "bench|client|docker|docs|examples|genaug|recipes|reliability|service|tests|tools|trainer"


def _resolves(name: str, bases: list[Path]) -> bool:
    return any((base / name).exists() for base in bases)


def missing_architecture_paths(text: str) -> list[str]:
    """The names in ``text`` (docs/architecture.md's) that exist nowhere they may be meant.

    A name in a row of the map resolves from that row's folder (`guard.py` in the
    `service/api/` row) or any folder above it; elsewhere, from the root, `service/` (the
    prose follows a request through service/'s layers: `api/guard.py`), `trainer/` (its layers:
    `reference/`) or, for a page, `docs/`, and a file name alone from any layer ("intake's
    `plan.py`"). A module name (`genaug.trainer`) must import."""
    import importlib.util

    prose = [ROOT, ROOT / "service", ROOT / "trainer", ROOT / "docs"]
    layers = [p for top in prose[1:3] for p in sorted(top.iterdir()) if p.is_dir()]
    missing = []
    for line in text.splitlines():
        row = re.match(r"\| `([\w/]+/)`", line)
        # a row's folder, then each folder above it up to the root (`genaug/doctor.py`)
        in_row = [ROOT / up for up in (row.group(1), *Path(row.group(1)).parents)] if row else []
        names = re.findall(rf"`({_PATH})`", line)
        bare = re.sub(r"`[^`]*`", " ", line)
        names += re.findall(rf"(?<![\w/.])((?:{_TOP}){_REST})", bare)
        names += re.findall(r"\]\(([\w./-]+\.md)(?:#[^)]*)?\)", line)
        for name in names:
            bases = in_row or (prose + layers if "/" not in name else prose)
            if not _resolves(name, bases):
                missing.append(f"{name} (line: {line.strip()[:60]}...)")
        for module in re.findall(r"`(genaug(?:\.\w+)+)`", line):
            if importlib.util.find_spec(module) is None:
                missing.append(f"{module} (module)")
    return missing


ARCHITECTURE = ROOT / "docs" / "architecture.md"


def test_every_path_the_architecture_names_exists() -> None:
    """docs/architecture.md is the map of the packages: a file moved or renamed without it fails
    here, naming the path the page still gives."""
    assert missing_architecture_paths(ARCHITECTURE.read_text()) == []


@pytest.mark.parametrize(("right", "wrong", "named"), [
    ("`targets.py` (targets and", "`target.py` (targets and", "target.py"),  # in a map row
    ("`pool/need.py`", "`pool/needs.py`", "pool/needs.py"),                 # prose, service/
    ("bench/pool/need_fill_rate.py", "bench/pool/fill_rate.py", "bench/pool/fill_rate.py"),
    ("`tests/test_import_order.py`", "`tests/test_imports.py`", "tests/test_imports.py"),  # root
    ("[deploy.md](deploy.md)", "[deploy.md](deploy2.md)", "deploy2.md"),    # a link
    ("`genaug.trainer`", "`genaug.trainers`", "genaug.trainers"),           # a module
    # a row's folder: it, and every name of the row below it
    ("| `trainer/feeding/` |", "| `trainer/feed/` |", "trainer/feed/"),
])
def test_a_wrong_path_in_the_architecture_is_named(right: str, wrong: str, named: str) -> None:
    """The check above can fail: the page with one name changed is caught on that name."""
    text = ARCHITECTURE.read_text()
    assert right in text, f"{right!r} is no longer in docs/architecture.md: pick another"
    missing = [m.split(" (")[0] for m in missing_architecture_paths(text.replace(right, wrong, 1))]
    assert missing[:1] == [named], missing
    if "| `" not in right:
        assert missing == [named]
    else:
        assert {"feeder.py", "callback.py", "need.py"} <= set(missing)
