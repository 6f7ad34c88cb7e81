"""The fault suite's own PostgreSQL: started for the suite, restarted as a fault, deleted at
the end. Never the machine's server (a restart there would hit everything else on it).

It is pgserver's bundled PostgreSQL (the same the embedded default runs), so the suite runs
on a machine that has only Python. pgserver listens on a Unix socket only; a restart keeps
the data directory and the socket, so every URL stays valid across it.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from pin_orchestration.migrations import upgrade_database

log = logging.getLogger(__name__)


class SuitePostgres:
    def __init__(self) -> None:
        import pgserver

        # Outside pytest's private tmp tree: as root the server runs as its own user.
        self.data_dir = Path(tempfile.mkdtemp(prefix="pin-faults-pg-"))
        self._server = pgserver.get_server(self.data_dir, cleanup_mode="delete")
        self.url = (
            make_url(self._server.get_uri())
            .set(drivername="postgresql+psycopg", database="postgres")
            .render_as_string(hide_password=False)
        )
        self._admin = create_engine(self.url, isolation_level="AUTOCOMMIT", pool_size=1)
        self._template: str | None = None
        self.restarts = 0

    def create_database(self, prefix: str = "faults") -> str:
        """A fresh database migrated to head (cloned from a template migrated once)."""
        if self._template is None:
            self._template = f"pin_faults_tpl_{uuid.uuid4().hex[:8]}"
            with self._admin.connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{self._template}"'))
            upgrade_database(self._database_url(self._template))
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        with self._admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{self._template}"'))
        return self._database_url(name)

    def _database_url(self, name: str) -> str:
        return make_url(self.url).set(database=name).render_as_string(hide_password=False)

    def restart(self, *, down_seconds: float = 0.0) -> float:
        """Crash-stop the server (`pg_ctl stop -m immediate`: no shutdown checkpoint, every
        connection cut) and start it again on the same socket; returns the seconds it was
        unreachable."""
        from pgserver._commands import pg_ctl

        info = self._server.get_postmaster_info()
        user = self._server.system_user
        began = time.monotonic()
        pg_ctl(["-m", "immediate", "-w", "stop"], pgdata=self.data_dir, user=user, timeout=30)
        if down_seconds:
            time.sleep(down_seconds)
        pg_ctl(
            [
                "-w",
                "-o",
                '-h ""',
                "-o",
                f"-k {info.socket_dir}",
                "-l",
                str(self._server.log),
                "start",
            ],
            pgdata=self.data_dir,
            user=user,
            timeout=60,
        )
        self._admin.dispose()
        self.restarts += 1
        took = time.monotonic() - began
        log.info("suite PostgreSQL restarted (%.1f s down)", took)
        return took

    def close(self) -> None:
        self._admin.dispose()
        try:
            self._server.cleanup()
        finally:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> SuitePostgres:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
