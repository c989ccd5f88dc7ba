"""What compiling made, kept between starts: ``GENAUG_COMPILE_CACHE``.

``torch.compile`` spends most of a cold warm-up in inductor: generating, compiling and tuning
kernels (C++ on the CPU, Triton on a GPU). Inductor keeps all of it in one folder
(``TORCHINDUCTOR_CACHE_DIR``: its FX graph and AOTAutograd caches, the compiled kernels,
Triton's cache below it), and a later process that finds them there skips that work. Pointing
torch's variable at a shared folder is not enough for a service, though: its entries would mix
models, options and machines, a copy to a machine of another instruction set could load a
kernel it cannot run, and a start killed while it compiles would leave half a folder. So:

- **One entry per key.** An entry is ``<GENAUG_COMPILE_CACHE>/<key>/``, the key a hash of what
  makes compiled code valid (:func:`cache_fields`: the model's weights hash, the acceleration
  options, the warm-up's shapes, the versions of Python, torch, triton and diffusers, and the
  device: the GPU's name and compute capability, or the CPU's instruction set as torch sees it,
  so a cache made with AVX-512 is never loaded where there is none).
- **Loaded before warm-up, into a private folder.** :meth:`CompileCache.open` makes a working
  folder for this process, copies a sound entry into it and points inductor (and Triton) at
  it; a process never writes into an entry.
- **Checked, then trusted.** An entry's ``entry.json`` lists its fields and the SHA-256 of
  every file. A missing or unreadable manifest, other fields (a hash collision, an edited
  file) or a file whose bytes differ is skipped with one log line naming the entry and why:
  never a crash, never a wrong kernel; the warm-up compiles as if there were none.
- **A folder that can hold it, or no start.** :func:`check_cache_folder` makes the folder
  and writes a probe into it before anything loads: a file, an unwritable or read-only folder
  is refused in one line (``genaug serve`` exits 2) rather than found out by the save, after
  minutes of compiling.
- **Written whole, once.** :meth:`CompileCache.save`, after a warm-up that compiled, copies the
  working folder to a temporary folder beside the entries, writes its manifest, and renames
  it into place: a Ctrl-C, a SIGTERM or a crash before that leaves no entry, and a reader
  never sees half of one. Two replicas saving the same key at once both succeed; one entry
  stays.

Example::

    cache = CompileCache(Path("~/.cache/genaug/compile").expanduser(), cache_fields(...))
    cache.open()       # 'hit' | 'miss' | 'skipped: ...'; sets TORCHINDUCTOR_CACHE_DIR
    ...                # warm up
    cache.save()       # 'saved 42 files (3.1 MiB)' | 'kept' (a sound entry was there)
    kept(cache.state)  # True: the entry holds what this warm-up compiled
    cache.close()      # removes the working folder
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import AccelerationError

__all__ = ["FORMAT", "CompileCache", "CompileCacheError", "cache_fields", "check_cache_folder",
           "default_cache_dir", "kept"]

log = logging.getLogger(__name__)

#: The layout of an entry; a change makes every older entry another key.
FORMAT = 1
MANIFEST = "entry.json"
FILES = "files"
#: Environment variables inductor and Triton read their cache folders from.
INDUCTOR_VAR = "TORCHINDUCTOR_CACHE_DIR"
TRITON_VAR = "TRITON_CACHE_DIR"


class CompileCacheError(AccelerationError):
    """``GENAUG_COMPILE_CACHE`` names a place no entry can be written to; the message (one
    line) names the variable, the path, why, and the fix."""


def check_cache_folder(root: Path) -> None:
    """Make ``root`` (as :meth:`CompileCache.save` would) and write a probe folder into it, as
    the save writes its staging folder; raises :class:`CompileCacheError` when either fails.
    Run before anything compiles: the save comes minutes later."""
    root = Path(root).expanduser()
    fix = ("point GENAUG_COMPILE_CACHE at a folder this process can write (it is created if "
           "missing), or set GENAUG_COMPILE_CACHE=off to keep nothing")
    if root.exists() and not root.is_dir():
        raise CompileCacheError(f"GENAUG_COMPILE_CACHE={root} is a file, not a folder, so "
                                f"nothing compiled could be kept there; {fix}")
    try:
        root.mkdir(parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=".probe-", dir=root))
    except OSError as exc:
        why = ("a file is in its path" if isinstance(exc, FileExistsError | NotADirectoryError)
               else f"{type(exc).__name__}: {exc.strerror or exc}")
        raise CompileCacheError(f"GENAUG_COMPILE_CACHE={root} cannot be written ({why}), so "
                                f"nothing compiled could be kept there; {fix}") from None


def kept(state: str) -> bool:
    """Whether a cache in ``state`` (after :meth:`CompileCache.save`) holds what the warm-up
    compiled: its entry was loaded and is unchanged (``kept``), or was written (``saved``)."""
    return state == "kept" or state.startswith("saved ")


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/genaug/compile`` (``~/.cache/genaug/compile``): where compiled code
    is kept when ``GENAUG_COMPILE_CACHE`` is unset."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "genaug" / "compile"


def cache_fields(*, weights_hash: str, options: str, shapes: list[str],
                 device: Any) -> dict[str, str]:
    """What makes compiled code valid here, as text: an entry is reused only where every field
    is equal. ``options`` is the acceleration options' label, ``shapes`` the warm-up's shapes,
    ``device`` the torch device the UNet runs on."""
    import torch

    fields = {
        "format": str(FORMAT),
        "weights": weights_hash,
        "options": options,
        "shapes": ",".join(shapes),
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "torch": torch.__version__,
        "diffusers": _version("diffusers"),
        "triton": _version("triton"),
    }
    if getattr(device, "type", "cpu") == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        fields.update(device=torch.cuda.get_device_name(device),
                      capability=f"{major}.{minor}", cuda=str(torch.version.cuda))
    else:
        # The CPU's instruction set as inductor compiles for it (AVX512, AVX2, DEFAULT ...).
        fields.update(device="cpu", capability=torch.backends.cpu.get_cpu_capability())
    return fields


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "none"


def _key(fields: Mapping[str, str]) -> str:
    canonical = json.dumps(dict(fields), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:20]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(folder: Path) -> dict[str, str]:
    """Every regular file under ``folder``, relative path -> SHA-256 (links are skipped:
    an entry holds bytes, never pointers elsewhere)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            out[path.relative_to(folder).as_posix()] = _sha256(path)
    return out


class CompileCache:
    """One process's view of ``GENAUG_COMPILE_CACHE`` for one key (module doc).

    ``state`` says what :meth:`open` found: ``"hit"`` (a sound entry was loaded), ``"miss"``
    (none), ``"skipped: <why>"`` (one that is not sound; the log says it once), and after
    :meth:`save` what it did: ``"kept"``, ``"saved <n> files (<size>)"``, or ``"not saved
    (<error>)"`` (:func:`kept` tells the first two apart from the rest).
    """

    def __init__(self, root: Path, fields: Mapping[str, str]) -> None:
        self.root = Path(root).expanduser()
        self.fields = dict(fields)
        self.key = _key(self.fields)
        self.entry = self.root / self.key
        self.workdir: Path | None = None
        self.state = "closed"
        self._loaded: dict[str, str] = {}
        self._previous: dict[str, str | None] = {}

    # -- start -------------------------------------------------------------------------

    def open(self) -> str:
        """Make this process's working folder, fill it from the entry when the entry is
        sound, and point inductor and Triton at it; what was found (``state``)."""
        self.workdir = Path(tempfile.mkdtemp(prefix=f"genaug-compile-{self.key[:8]}-"))
        self.state = self._load()
        self._previous = {var: os.environ.get(var) for var in (INDUCTOR_VAR, TRITON_VAR)}
        os.environ[INDUCTOR_VAR] = str(self.workdir / "inductor")
        os.environ[TRITON_VAR] = str(self.workdir / "inductor" / "triton")
        _forget_in_memory_caches()
        if self.state == "hit":
            log.info("compile cache %s: loaded %d files (%s)", self.entry, len(self._loaded),
                     _size(self.workdir))
        elif self.state == "miss":
            log.info("compile cache %s: no entry yet; the warm-up compiles and saves one",
                     self.entry)
        return self.state

    def _load(self) -> str:
        assert self.workdir is not None
        if not self.entry.exists():
            return "miss"
        why = self._unsound()
        if why is not None:
            log.warning("compile cache entry %s skipped: %s; compiling as if it were not "
                        "there (it is replaced after the warm-up)", self.entry, why)
            return f"skipped: {why}"
        shutil.copytree(self.entry / FILES, self.workdir, dirs_exist_ok=True, symlinks=False)
        return "hit"

    def _unsound(self) -> str | None:
        """Why the entry cannot be used, or None; ``_loaded`` holds its files when sound."""
        try:
            manifest = json.loads((self.entry / MANIFEST).read_text())
            fields, files = manifest["fields"], manifest["files"]
            if not isinstance(fields, dict) or not isinstance(files, dict):
                raise TypeError("fields and files must be objects")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return f"its {MANIFEST} is missing or unreadable ({type(exc).__name__}: {exc})"
        if fields != self.fields:
            other = sorted(k for k in self.fields.keys() | fields.keys()
                           if fields.get(k) != self.fields.get(k))
            return f"it was made for other {', '.join(other)}"
        found = _files(self.entry / FILES) if (self.entry / FILES).is_dir() else {}
        for name, digest in files.items():
            if found.get(name) != digest:
                return (f"file {name} is {'missing' if name not in found else 'changed'} "
                        "(spoiled)")
        extra = sorted(set(found) - set(files))
        if extra:
            return f"file {extra[0]} is not in its manifest (spoiled)"
        self._loaded = dict(files)
        return None

    # -- after the warm-up ---------------------------------------------------------------

    def save(self) -> str:
        """Write the working folder as the entry when it holds anything the entry lacks
        (module doc: whole, atomically, or not at all); what happened."""
        if self.workdir is None:
            return self.state
        files = _files(self.workdir)
        if not files or (self.state == "hit" and files == self._loaded):
            self.state = "kept" if self.state == "hit" else self.state
            return self.state
        try:
            written = self._write()
        except OSError as exc:  # the state says it too: /v1/info, and --warm-only's exit
            self.state = f"not saved ({type(exc).__name__}: {exc})"
            raise
        self.state = f"saved {len(written)} files ({_size(self.entry / FILES)})"
        log.info("compile cache %s: %s", self.entry, self.state)
        return self.state

    def _write(self) -> dict[str, str]:
        """Copy the working folder to a staging folder beside the entries and rename it into
        place; the files written."""
        assert self.workdir is not None
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{self.key}.", dir=self.root))
        try:
            shutil.copytree(self.workdir, staging / FILES, symlinks=False)
            written = _files(staging / FILES)  # what is there, not what was meant to be
            manifest = {"fields": self.fields, "files": written, "created": time.time(),
                        "format": FORMAT}
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
            self._replace(staging)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return written

    def _replace(self, staging: Path) -> None:
        """Move ``staging`` into place: over nothing, or over an entry that is not sound;
        a sound entry another process saved meanwhile stays (either is as good)."""
        try:
            os.rename(staging, self.entry)
            return
        except OSError:
            if self._unsound() is None:
                return  # another process saved a sound one first
        aside = self.root / f".{self.key}.old-{os.getpid()}"
        os.rename(self.entry, aside)
        try:
            os.rename(staging, self.entry)
        finally:
            shutil.rmtree(aside, ignore_errors=True)

    def close(self) -> None:
        """Remove the working folder; inductor's variables go back to what they were."""
        for var, value in self._previous.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def describe(self) -> dict[str, Any]:
        """What ``/v1/info``'s ``acceleration.compile_cache`` shows."""
        return {"folder": str(self.root), "key": self.key, "state": self.state}


def _forget_in_memory_caches() -> None:
    """Inductor memoises what it read from its folder; a new folder starts from nothing."""
    try:
        from torch._inductor.utils import clear_caches
    except ImportError:  # pragma: no cover - older torch
        return
    clear_caches()


def _size(folder: Path) -> str:
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return f"{total / 2**20:.1f} MiB"
