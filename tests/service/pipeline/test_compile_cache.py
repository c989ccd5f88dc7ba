"""GENAUG_COMPILE_CACHE, the folder part: entries keyed by what makes compiled code valid,
loaded into a private working folder, checked file by file, written whole or not at all.
(The service's starts through it, cold, from the cache and with a spoiled entry, are in
tests/service/pipeline/test_warm_start.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from genaug.service.pipeline.compile_cache import (
    INDUCTOR_VAR,
    MANIFEST,
    CompileCache,
    CompileCacheError,
    cache_fields,
    check_cache_folder,
    default_cache_dir,
    kept,
)

FIELDS = {"format": "1", "weights": "e83cc8e0ba5098d6", "options": "compile=unet",
          "shapes": "64x64:8", "torch": "2.13.0+cpu", "device": "cpu", "capability": "AVX2"}


@pytest.fixture(autouse=True)
def keep_inductors_folder() -> object:
    """open() points inductor at its working folder; close() restores: check it does."""
    before = os.environ.get(INDUCTOR_VAR)
    yield
    assert os.environ.get(INDUCTOR_VAR) == before


def compiled(cache: CompileCache, files: dict[str, bytes]) -> None:
    """What a warm-up's compile leaves in the working folder."""
    assert cache.workdir is not None
    for name, data in files.items():
        path = cache.workdir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def test_a_miss_saves_one_entry_that_the_next_start_loads(tmp_path: Path) -> None:
    first = CompileCache(tmp_path, FIELDS)
    assert first.open() == "miss"
    assert os.environ[INDUCTOR_VAR] == str(first.workdir / "inductor")
    compiled(first, {"inductor/fxgraph/ab/entry": b"graph", "inductor/k/kernel.so": b"\x7fELF"})
    assert first.save().startswith("saved 2 files")
    first.close()
    assert first.workdir is None and (first.entry / MANIFEST).is_file()
    manifest = json.loads((first.entry / MANIFEST).read_text())
    assert manifest["fields"] == FIELDS and set(manifest["files"]) == {
        "inductor/fxgraph/ab/entry", "inductor/k/kernel.so"}
    again = CompileCache(tmp_path, FIELDS)
    assert again.open() == "hit"
    assert again.workdir is not None and again.workdir != first.workdir  # a private copy
    assert (again.workdir / "inductor/k/kernel.so").read_bytes() == b"\x7fELF"
    assert again.save() == "kept"  # nothing new: the entry stays as it was
    again.close()


def test_another_machine_or_model_is_another_key(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path, FIELDS)
    cache.open()
    compiled(cache, {"inductor/x": b"avx2 code"})
    cache.save()
    cache.close()
    for field, value in (("capability", "AVX512"), ("weights", "0" * 16),
                         ("shapes", "64x64:8,32x32:8"), ("torch", "2.14.0")):
        other = CompileCache(tmp_path, {**FIELDS, field: value})
        assert other.key != cache.key and other.open() == "miss", field
        other.close()


@pytest.mark.parametrize(("spoil", "said"), [
    (lambda e: (e / "files/inductor/k/kernel.so").write_bytes(b"half a kern"),
     "file inductor/k/kernel.so is changed (spoiled)"),
    (lambda e: (e / "files/inductor/k/kernel.so").unlink(),
     "file inductor/k/kernel.so is missing (spoiled)"),
    (lambda e: (e / "files/inductor/stray").write_bytes(b"?"),
     "file inductor/stray is not in its manifest (spoiled)"),
    (lambda e: (e / MANIFEST).write_text("{not json"), "is missing or unreadable"),
    (lambda e: (e / MANIFEST).write_text(json.dumps(
        {"fields": {**FIELDS, "capability": "AVX512"}, "files": {}})),
     "it was made for other capability"),
])
def test_a_spoiled_entry_is_skipped_in_one_line_and_replaced(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, spoil: object, said: str) -> None:
    cache = CompileCache(tmp_path, FIELDS)
    cache.open()
    compiled(cache, {"inductor/k/kernel.so": b"\x7fELF kernel"})
    cache.save()
    cache.close()
    spoil(cache.entry)  # type: ignore[operator]
    again = CompileCache(tmp_path, FIELDS)
    with caplog.at_level("WARNING", logger="genaug.service.pipeline.compile_cache"):
        state = again.open()
    assert state.startswith("skipped: ") and said in state, state
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and str(again.entry) in lines[0] and "\n" not in lines[0], lines
    assert again.workdir is not None and not list(again.workdir.rglob("kernel.so"))
    compiled(again, {"inductor/k/kernel.so": b"\x7fELF kernel"})  # compiled anew
    assert again.save().startswith("saved 1 files")
    again.close()
    third = CompileCache(tmp_path, FIELDS)
    assert third.open() == "hit"
    third.close()


def test_an_interrupted_save_leaves_no_entry_and_a_concurrent_one_wins_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = CompileCache(tmp_path, FIELDS)
    cache.open()
    compiled(cache, {"inductor/a": b"a" * 1000})

    def killed(*args: object) -> None:
        raise KeyboardInterrupt  # Ctrl-C between the copy and the rename

    monkeypatch.setattr(os, "rename", killed)
    with pytest.raises(KeyboardInterrupt):
        cache.save()
    monkeypatch.undo()
    assert not cache.entry.exists() and [p.name for p in tmp_path.iterdir()] == []
    # Two replicas save the same key: the first stays, the second's copy is dropped.
    other = CompileCache(tmp_path, FIELDS)
    other.open()
    compiled(other, {"inductor/a": b"a" * 1000})
    assert other.save().startswith("saved")
    assert cache.save().startswith("saved")
    assert sorted(p.name for p in tmp_path.iterdir()) == [cache.key]
    for c in (other, cache):  # last opened, first closed: each restores what it found
        c.close()


def test_the_fields_name_the_cpu_instruction_set_and_the_versions() -> None:
    import torch

    fields = cache_fields(weights_hash="w", options="compile=unet", shapes=["64x64:8"],
                          device=torch.device("cpu"))
    assert fields["capability"] == torch.backends.cpu.get_cpu_capability()
    assert fields["torch"] == torch.__version__ and fields["device"] == "cpu"
    assert fields["shapes"] == "64x64:8" and fields["diffusers"] != "none"


def test_the_default_folder_is_the_users_cache(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "genaug" / "compile"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "genaug" / "compile"


def test_a_folder_no_entry_can_be_written_to_is_refused_in_one_line(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    for root, why in ((afile, "is a file, not a folder"),
                      (afile / "sub", "cannot be written (a file is in its path)")):
        with pytest.raises(CompileCacheError) as info:
            check_cache_folder(root)
        said = str(info.value)
        assert said.startswith(f"GENAUG_COMPILE_CACHE={root} {why}") and "\n" not in said
        assert "GENAUG_COMPILE_CACHE=off" in said  # the fix
    fresh = tmp_path / "a" / "b"
    check_cache_folder(fresh)  # made, as the save would make it; the probe is gone
    assert fresh.is_dir() and list(fresh.iterdir()) == []


def test_a_save_that_fails_says_so_in_its_state(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path / "cache", FIELDS)
    try:
        assert cache.open() == "miss"
        compiled(cache, {"inductor/k/kernel.so": b"\x7fELF"})
        (tmp_path / "cache").write_text("a file now")  # the volume changed under the warm-up
        with pytest.raises(OSError):
            cache.save()
    finally:
        cache.close()
    assert cache.state.startswith("not saved (FileExistsError: ") and not kept(cache.state)
    assert kept("kept") and kept("saved 2 files (0.1 MiB)")
    assert not any(kept(state) for state in ("miss", "hit", "skipped: spoiled", "closed"))
