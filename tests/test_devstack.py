"""`pin up` as an operator runs it: Dagster UI + daemon on PostgreSQL storage, demo data, a
materialization launched through the UI's GraphQL API, metrics, and a clean shutdown."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import requests
from dagster_graphql import DagsterGraphQLClient
from sqlalchemy import text

from pin_orchestration.db import create_db_engine

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def responds(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


LAUNCH_BACKFILL = """
mutation($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
  }
}
"""
BACKFILL_STATUS = """
query($id: String!) {
  partitionBackfillOrError(backfillId: $id) { ... on PartitionBackfill { status } }
}
"""


def graphql(port: int, query: str, variables: dict) -> dict:
    answer = requests.post(
        f"http://127.0.0.1:{port}/graphql",
        json={"query": query, "variables": variables},
        timeout=30,
    ).json()
    assert "errors" not in answer, answer
    return answer["data"]


def reconcile_runs(db_url: str) -> list[tuple[str, str]]:
    with create_db_engine(db_url).connect() as conn:
        return [
            tuple(row)
            for row in conn.execute(
                text(
                    "SELECT status, run_id FROM pin.job_runs "
                    "WHERE job_code = 'news-comment-reconcile' ORDER BY id"
                )
            )
        ]


def drifted_posts(db_url: str) -> int:
    with create_db_engine(db_url).connect() as conn:
        return conn.execute(
            text(
                """
                SELECT count(*) FROM news.posts AS p
                WHERE p.status <> 'Archived' AND p.comments_count <> (
                    SELECT count(*) FROM news.comments AS c
                    WHERE c.post_id = p.id AND c.status = 'Visible')
                """
            )
        ).scalar_one()


def test_pin_up_serves_the_ui_runs_a_materialization_and_stops_cleanly(
    db_url: str, tmp_path: Path
) -> None:
    port, metrics_port, api_port = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "PIN_DATABASE_URL": db_url,
        "PIN_HOME": str(tmp_path / "home"),
        "PIN_SCRAPING_ALLOWED_CIDRS": "127.0.0.1/32",  # what ./scripts/run sets
    }
    env.pop("PIN_DAGSTER_PG_URL", None)
    log_path = tmp_path / "pin-up.log"
    output = log_path.open("w")
    stack = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pin_orchestration.cli",
            "up",
            "--port",
            str(port),
            "--metrics-port",
            str(metrics_port),
            "--api-port",
            str(api_port),
            "--dagster-yaml",
            str(ROOT / "dagster.yaml"),
            "--workspace",
            str(ROOT / "workspace.yaml"),
        ],
        env=env,
        cwd=ROOT,  # where an operator runs it: next to the repository's dagster.yaml
        stdout=output,
        stderr=subprocess.STDOUT,
        # Its own session, as under a service manager: the stop signal below reaches its
        # PID alone, never its children through a shared process group.
        start_new_session=True,
    )
    try:
        wait_until(lambda: responds(f"http://127.0.0.1:{port}/server_info"), 180, "the UI")
        assert drifted_posts(db_url) > 0, "the demo data should come with drift"

        client = DagsterGraphQLClient("127.0.0.1", port_number=port)
        run_id = client.submit_job_execution(
            "news_comment_reconcile",
            repository_location_name="pin_orchestration",
            run_config={"ops": {"news__post_comment_counts": {"config": {"scope": "FullSweep"}}}},
            tags={"dagster/partition": "2026-11-29"},
        )
        wait_until(
            lambda: client.get_run_status(run_id).value in ("SUCCESS", "FAILURE", "CANCELED"),
            180,
            "the run",
        )
        assert client.get_run_status(run_id).value == "SUCCESS"
        assert drifted_posts(db_url) == 0

        metrics = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
        corrected = next(
            line
            for line in metrics.splitlines()
            if line.startswith("news_comment_reconcile_drift_corrected_total")
        )
        assert float(corrected.split()[1]) > 0

        # A backfill of two past days from the UI: the backfill daemon launches a run per
        # day, and each one reconciles its day.
        launched = graphql(
            port,
            LAUNCH_BACKFILL,
            {
                "params": {
                    "assetSelection": [{"path": ["news", "post_comment_counts"]}],
                    "partitionNames": ["2026-01-05", "2026-01-06"],
                }
            },
        )["launchPartitionBackfill"]
        assert launched["__typename"] == "LaunchBackfillSuccess", launched
        backfill = launched["backfillId"]
        wait_until(
            lambda: (
                graphql(port, BACKFILL_STATUS, {"id": backfill})["partitionBackfillOrError"][
                    "status"
                ]
                not in ("REQUESTED", "CANCELING", "FAILING")
            ),
            240,
            "the backfill",
        )
        status = graphql(port, BACKFILL_STATUS, {"id": backfill})["partitionBackfillOrError"]
        assert status["status"] in ("COMPLETED", "COMPLETED_SUCCESS"), status
        # The Launchpad run and both backfill days reconciled; none skipped on the lock.
        assert [status for status, _ in reconcile_runs(db_url)] == ["succeeded"] * 3

        # Dagster's own storage is the PostgreSQL database, not files in DAGSTER_HOME.
        with create_db_engine(db_url).connect() as conn:
            stored = conn.execute(
                text("SELECT count(*) FROM runs WHERE run_id = :r"), {"r": run_id}
            ).scalar_one()
        assert stored == 1

        # Scraping as a new user tries it: the demo jobs go through on their own (sensor →
        # worker run → store), then a job of our own with the printed key, its result
        # downloaded through the signed URL.
        api = f"http://127.0.0.1:{api_port}"
        key = (tmp_path / "home" / "demo-api-key").read_text().strip()
        wait_until(lambda: demo_jobs_settled(db_url), 180, "the demo scraping jobs")
        assert demo_job_statuses(db_url) == {"succeeded": 2, "failed": 1}
        headers = {"Authorization": f"Bearer {key}"}
        page = next(u for u in demo_job_urls(db_url) if "/page/" in u)
        receipt = requests.post(
            f"{api}/jobs",
            json={"url": page.replace("welcome", "mine")},
            headers=headers,
            timeout=10,
        )
        assert receipt.status_code == 202, receipt.text
        job_url = f"{api}{receipt.json()['links']['self']}"
        wait_until(
            lambda: (
                requests.get(job_url, headers=headers, timeout=10).json()["status"] == "succeeded"
            ),
            120,
            "our scraping job",
        )
        link = requests.get(f"{job_url}/result", headers=headers, timeout=10).json()
        body = requests.get(link["url"], timeout=10)
        assert body.status_code == 200 and b"demo page /page/mine" in body.content

        children = psutil.Process(stack.pid).children(recursive=True)
        assert children, "dagster dev should be running under pin up"
    finally:
        # SIGINT to the PID alone (Ctrl-C of a service manager); SIGTERM takes the same path.
        os.kill(stack.pid, signal.SIGINT)
        stack.wait(timeout=120)
        output.close()
    gone, alive = psutil.wait_procs(children, timeout=60)
    assert alive == [], f"left running after pin up stopped: {[p.pid for p in alive]}"
    assert stack.returncode == 0, log_path.read_text()[-5000:]
    log = log_path.read_text()
    # What an operator sees is the system's own news, not known noise.
    for noise in ("INFO pgserver", "PreviewWarning", "will not be used to configure Dagster"):
        assert noise not in log, noise


def demo_job_statuses(db_url: str) -> dict[str, int]:
    with create_db_engine(db_url).connect() as conn:
        return dict(
            conn.execute(text("SELECT status, count(*) FROM scraping.jobs GROUP BY status")).all()
        )


def demo_jobs_settled(db_url: str) -> bool:
    statuses = demo_job_statuses(db_url)
    return sum(statuses.values()) >= 3 and not ({"queued", "running"} & set(statuses))


def demo_job_urls(db_url: str) -> list[str]:
    with create_db_engine(db_url).connect() as conn:
        return list(conn.execute(text("SELECT url FROM scraping.jobs")).scalars())
