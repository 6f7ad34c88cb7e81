"""The fault suite's own PostgreSQL: started for the suite, restarted as a fault, deleted at
the end. Never the machine's server (a restart there would hit everything else on it).

It is pgserver's bundled PostgreSQL (the same the embedded default runs), so the suite runs
on a machine that has only Python. pgserver starts it on a Unix socket only; the suite
restarts it at once to listen on a free loopback TCP port too, so a scenario can put a
`FaultProxy` in front of it (`database_url_via`: a hung server, not a restarted one) and
its clients' TCP timeouts and keepalives are the ones a deployment runs with. A restart
keeps the data directory, the socket and the port, so every URL stays valid across it.
"""

from __future__ import annotations

import logging
import shutil
import socket
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from faults.proxy import FaultProxy
from pin_orchestration.migrations import upgrade_database

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def proxy_in_front_of(url: str) -> FaultProxy:
    """A FaultProxy to `url`'s server: its TCP address, or the Unix socket its `host`
    parameter names (the embedded default and pgserver listen on a socket only)."""
    parsed = make_url(url)
    port = parsed.port or 5432
    socket_dir = parsed.query.get("host")
    if isinstance(socket_dir, str) and socket_dir.startswith("/"):
        return FaultProxy(LOOPBACK, port, upstream_unix_socket=f"{socket_dir}/.s.PGSQL.{port}")
    return FaultProxy(parsed.host or LOOPBACK, port)


def database_url_via(url: str, proxy: FaultProxy) -> str:
    """`url` with its server address replaced by the proxy's: the same database, user and
    options, reached over TCP through `proxy` (a Unix-socket `host` parameter is dropped).
    Put the proxy in front of the suite's server with `FaultProxy(*postgres.tcp_address)`;
    `proxy.set_mode("hang")` then blackholes that URL's connections, open and new."""
    host, port = proxy.address.rsplit(":", 1)
    return (
        make_url(url)
        .difference_update_query(["host", "hostaddr", "port"])
        .set(host=host, port=int(port))
        .render_as_string(hide_password=False)
    )


class SuitePostgres:
    def __init__(self) -> None:
        import pgserver

        # Outside pytest's private tmp tree: as root the server runs as its own user.
        self.data_dir = Path(tempfile.mkdtemp(prefix="pin-faults-pg-"))
        self._server = pgserver.get_server(self.data_dir, cleanup_mode="delete")
        self.tcp_address = (LOOPBACK, _free_loopback_port())
        self._stop_and_start(stop_mode="fast")
        socket_url = make_url(self._server.get_uri())
        # The socket's name carries the port: the socket URL names it too.
        self.url = socket_url.set(
            drivername="postgresql+psycopg", database="postgres", port=self.tcp_address[1]
        ).render_as_string(hide_password=False)
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
        began = time.monotonic()
        self._stop_and_start(stop_mode="immediate", down_seconds=down_seconds)
        self._admin.dispose()
        self.restarts += 1
        took = time.monotonic() - began
        log.info("suite PostgreSQL restarted (%.1f s down)", took)
        return took

    def _stop_and_start(self, *, stop_mode: str, down_seconds: float = 0.0) -> None:
        from pgserver._commands import pg_ctl
        from pgserver.utils import PostmasterInfo

        info = self._server.get_postmaster_info()
        user = self._server.system_user
        pg_ctl(["-m", stop_mode, "-w", "stop"], pgdata=self.data_dir, user=user, timeout=30)
        if down_seconds:
            time.sleep(down_seconds)
        host, port = self.tcp_address
        pg_ctl(
            [
                "-w",
                "-o",
                f"-h {host} -p {port}",
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
        # pgserver's cleanup stops the postmaster it last saw: the new one, not the old pid.
        self._server._postmaster_info = PostmasterInfo.read_from_pgdata(self.data_dir)

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
