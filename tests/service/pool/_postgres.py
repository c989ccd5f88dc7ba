"""A real, throwaway PostgreSQL server for the pool tests (never a mock).

:class:`PgCluster` runs ``initdb`` and ``pg_ctl`` from PATH or ``/usr/lib/postgresql/*/bin``
into a fresh folder and serves it on a free 127.0.0.1 port (password authentication, so wrong
credentials can be tested). ``initdb`` refuses to run as root: as root the server runs as the
``postgres`` user (or ``nobody``) through ``runuser``. :func:`shared_cluster` starts one per
test process, stopped at exit; :meth:`PgCluster.new_database` gives each test its own
database. Without the binaries the tests skip with the install command, and fail under
``CI=true`` (CI installs them).

    cluster = shared_cluster()          # skips (or fails under CI) without PostgreSQL
    url = cluster.new_database()        # postgresql://genaug:...@127.0.0.1:PORT/t_ab12...
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest

INSTALL = "apt-get install -y postgresql"
USER = "genaug"
PASSWORD = "genaug-test-password"


def find_bin() -> Path | None:
    """The folder holding initdb and pg_ctl, or None."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(os.path.realpath(found)).parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name)
        if Path(p).parent.name.isdigit() else 0,
    )
    for folder in reversed(candidates):
        if (Path(folder) / "initdb").exists() and (Path(folder) / "pg_ctl").exists():
            return Path(folder)
    return None


def require_bin() -> Path:
    folder = find_bin()
    if folder is None:
        message = (f"PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or under "
                   f"/usr/lib/postgresql/*/bin; install them: {INSTALL}")
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_user() -> str | None:
    """Whom to run the server as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    pytest.fail("running as root and neither user postgres nor nobody exists for initdb")


class PgCluster:
    """One PostgreSQL server in a temporary folder; ``start()``, ``stop()``, ``destroy()``."""

    def __init__(self) -> None:
        self.bin = require_bin()
        self.user = _server_user()
        self.root = Path(tempfile.mkdtemp(prefix="genaug-pg-"))
        self.data = self.root / "data"
        self.socket_dir = self.root / "sock"
        self.log = self.root / "server.log"
        self.port = _free_port()
        self.socket_dir.mkdir()
        pwfile = self.root / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self.user is not None:
            info = pwd.getpwnam(self.user)
            os.chmod(self.root, 0o755)
            for path in (self.root, self.socket_dir, pwfile):
                os.chown(path, info.pw_uid, info.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", USER, "--pwfile", str(pwfile),
                  "--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8",
                  "--locale=C", "--no-sync")
        pwfile.unlink()
        self.running = False

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin / tool), *args]
        if self.user is not None:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=self.root)
        if check and run.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"{tool} failed ({run.returncode}): {run.stderr}\n{log[-2000:]}")
        return run

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1 "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                   "-c max_connections=100")
        if self.user is not None and not self.log.exists():
            self.log.touch()
            info = pwd.getpwnam(self.user)
            os.chown(self.log, info.pw_uid, info.pw_gid)
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
                  "-t", "60", "start")
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        if self.running:
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop",
                      check=False)
            self.running = False

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres", password: str = PASSWORD) -> str:
        return f"postgresql://{USER}:{password}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database on this server; its URL."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)


_SHARED: list[PgCluster] = []


def shared_cluster() -> PgCluster:
    """One running server per test process (started on first use, destroyed at exit)."""
    if not _SHARED:
        cluster = PgCluster()
        cluster.start()
        _SHARED.append(cluster)
        atexit.register(cluster.destroy)
    return _SHARED[0]


def stored_schema_version(store: Any) -> str:
    """``meta.schema_version`` as the pool's database holds it (after an upgrade in place)."""
    with store._tx(write=False) as conn:
        row = store._exec(conn, "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return str(row[0])


#: What each schema version added to a PostgreSQL pool, as the statements that undo it.
_UNDO = {
    3: [*(f"ALTER TABLE images DROP COLUMN {c}"
          for c in ("score", "judge_keep", "verdict", "verdict_at", "accepted")),
        *(f"ALTER TABLE counters DROP COLUMN {c}" for c in ("judged_total", "accepted_total"))],
    4: [*(f"ALTER TABLE images DROP COLUMN {c}" for c in ("steps", "guidance", "strength",
                                                          "adapter_hash", "judge_key",
                                                          "judge_settings")),
        "DROP TABLE jobs", "DROP TABLE stops"],
    5: ["ALTER TABLE jobs DROP COLUMN webhook_first", "DROP TABLE recipes"],
    6: ["ALTER TABLE images DROP COLUMN speed", "ALTER TABLE images DROP COLUMN sampler",
        "DROP TABLE samplers", "DROP TABLE sampler_tallies"],
    7: [],  # samplers named by id: data, rewritten by the upgrade (no column changes)
}


def back_to_version(store: Any, version: int) -> None:
    """Take a PostgreSQL pool back to the layout of schema ``version`` (an older genaug's
    database), newest change undone first, so that the next open upgrades it in place."""
    from genaug.service.pool.types import SCHEMA_VERSION

    with store._tx(write=True) as conn:
        for added in range(SCHEMA_VERSION, version, -1):
            for statement in _UNDO[added]:
                store._exec(conn, statement)
        store._exec(conn, "UPDATE meta SET value = ? WHERE key = 'schema_version'",
                    (str(version),))
