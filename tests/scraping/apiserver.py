"""The API as clients meet it: `pin api` (uvicorn) in a process of its own on loopback,
for what TestClient cannot show — limits enforced by the HTTP server, several API
processes sharing one database, what uvicorn writes to its logs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests

from tests.scraping.conftest import free_loopback_port

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ApiProcess:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def api_process(
    db_url: str | None,
    home: Path,
    env: Mapping[str, str] | None = None,
    *,
    uvicorn_args: tuple[str, ...] | None = None,
    api_args: tuple[str, ...] = (),
) -> Iterator[ApiProcess]:
    """`pin api` (with `api_args`, e.g. --workers) on a free loopback port, on `db_url` or
    (None) the embedded default; or uvicorn itself with `uvicorn_args`, e.g. to turn its
    access log on. stdout and stderr go to a file the test can read."""
    port = free_loopback_port()
    home.mkdir(parents=True, exist_ok=True)
    full_env = {
        **os.environ,
        "PIN_HOME": str(home),
        "PIN_API_PUBLIC_URL": f"http://127.0.0.1:{port}",
        **(env or {}),
    }
    full_env.pop("PIN_REDIS_URL", None)
    full_env.pop("PIN_DATABASE_URL", None)
    if db_url is not None:  # else the embedded default under PIN_HOME
        full_env["PIN_DATABASE_URL"] = db_url
    if uvicorn_args is None:
        command = [
            str(Path(sys.executable).parent / "pin"),
            "api",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *api_args,
        ]
    else:
        command = [
            sys.executable,
            "-m",
            "uvicorn",
            "pin_orchestration.scraping.api.app:app_from_env",
            "--factory",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *uvicorn_args,
        ]
    log_path = home / f"api-{port}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, env=full_env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        # Until it answers or dies: the bound only ends a broken start (a starved machine
        # takes a minute to import `pin`), and a health check answered late is asked again.
        deadline = time.monotonic() + 240
        while True:
            try:
                if requests.get(f"{url}/healthz", timeout=10).status_code == 200:
                    break
            except (requests.ConnectionError, requests.Timeout):
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the API did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        yield ApiProcess(url, process, log_path)
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
