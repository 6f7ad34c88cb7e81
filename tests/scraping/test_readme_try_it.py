"""The "Try it" block of docs/jobs/scraping.md (linked from the README), run in bash as a
reader would after `./scripts/run`: only the API's and the demo site's addresses and the
printed key differ (ports of the test's own), and a worker run drains the job between
submitting and reading."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from pin_orchestration.devstack.standins.scraping_target import ScrapingTarget
from pin_orchestration.scraping.store.local import build_result_store
from pin_orchestration.scraping.store.tenancy import create_tenant
from tests.scraping.apiserver import api_process
from tests.scraping.conftest import Worker

ROOT = Path(__file__).resolve().parents[2]


def try_it_blocks() -> list[str]:
    page = (ROOT / "docs" / "jobs" / "scraping.md").read_text()
    section = page.split("## Try it\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)


def bash(script: str, **variables: str) -> str:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env={"PATH": "/usr/bin:/bin", **variables},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"{script}\n{done.stderr}"
    return done.stdout


def test_the_try_it_block_submits_reads_and_downloads_as_written(
    db_url: str, db_engine, tmp_path: Path, site: ScrapingTarget, work: Worker
) -> None:
    _, key = create_tenant(db_engine, "demo")
    home = tmp_path / "pin"
    with api_process(db_url, home) as api:
        submit, read = (
            block.replace("127.0.0.1:8000", api.url.removeprefix("http://"))
            .replace("http://127.0.0.1:8791", site.url)
            .replace("KEY=pin_...", f"KEY={key}")
            for block in try_it_blocks()
        )
        job_id = bash(submit + '\necho "$ID"').strip().splitlines()[-1]
        assert re.fullmatch(r"[0-9a-f-]{36}", job_id), job_id

        store = build_result_store(
            bucket=None, endpoint_url=None, region_name=None, home=home, public_base_url=api.url
        )
        work(store=store)
        # curl -s adds no newlines: the three answers come one after another.
        answers = bash(read, KEY=key, ID=job_id)
    assert f'{{"id":"{job_id}","status":"succeeded"' in answers
    assert '"expires_at":' in answers
    assert answers.endswith("<h1>demo page /page/hello</h1><p>query </p></body></html>")
