"""The docs move with the code: README's settings table and route table match the service."""

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


def test_every_setting_is_in_the_readme_table() -> None:
    rows = set(re.findall(r"^\| `(GENAUG_[A-Z_]+)` \|", README, flags=re.M))
    fields = {f"GENAUG_{name.upper()}" for name in Settings.model_fields}
    assert fields - rows == set(), "settings missing from README"
    assert rows - fields == set(), "README lists settings that do not exist"


def test_every_setting_has_a_description() -> None:
    assert [n for n, f in Settings.model_fields.items() if not f.description] == []


def test_every_route_is_in_the_readme(make_service: Any, shapes_recipes_file: Path,
                                      tmp_path: Path) -> None:
    """Each method and path the schema serves (with a recipe, so the recipe routes are there)
    is a `METHOD /path` cell of the README's HTTP API table, and the table names no route the
    service lacks."""
    import httpx

    live = make_service(recipes=shapes_recipes_file, pool_path=tmp_path / "pool.db",
                        pregenerate=False)
    spec = httpx.get(live.url + "/openapi.json").json()
    # the schema writes one path per configured recipe (names are an enum); the README, one
    served = {(method.upper(), path.replace("/v1/recipes/shapes", "/v1/recipes/{name}"))
              for path, ops in spec["paths"].items() for method in ops}
    table = README.split("## HTTP API", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`(GET|POST|PUT|PATCH|DELETE) (/[^`\s]*)`", table))
    assert served - listed == set(), "routes missing from the README's HTTP API table"
    # served, but not API routes in the schema
    pages = {("GET", "/"), ("GET", "/docs"), ("GET", "/pool/{name}")}
    assert listed - served - pages == set(), "the README lists routes the service lacks"


def test_cli_help_lists_the_commands() -> None:
    out = subprocess.run([sys.executable, "-m", "genaug.cli", "--help"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    for command in ("serve", "demo", "pregenerate", "export", "train", "doctor"):
        assert command in out


def test_a_command_without_its_extras_says_what_to_install(capsys: Any, monkeypatch: Any
                                                           ) -> None:
    from genaug.cli import main
    from genaug.commands import MissingExtraError, library

    with pytest.raises(MissingExtraError) as raised:
        library("genaug.not_installed_here", "doctor", "client")
    assert str(raised.value).startswith(
        "genaug doctor needs the client extras: pip install 'genaug[client]' (")
    assert "genaug.not_installed_here" in str(raised.value)

    # the whole command: its library cannot be imported (as without the extra), one line, exit 2
    monkeypatch.setitem(sys.modules, "genaug.doctor", None)
    assert main(["doctor", "--json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("genaug doctor needs the client extras: pip install 'genaug[client]' (")
    assert err.count("\n") == 1


def test_readme_commands_exist_in_the_makefile() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "make demo" in README and "make test" in README
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_the_docs_land_on_a_heading() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             ROOT / "bench" / "README.md"]
    anchors = {
        page.resolve(): {_slug(h) for h in re.findall(r"^#+ (.+)$", page.read_text(), re.M)}
        for page in pages
    }
    broken = []
    for page in pages:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", page.read_text()):
            linked = (page.parent / target).resolve() if target else page.resolve()
            if linked in anchors and anchor not in anchors[linked]:
                broken.append(f"{page.relative_to(ROOT)}: {target}#{anchor}")
    assert broken == []
