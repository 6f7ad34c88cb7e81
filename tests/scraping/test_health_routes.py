"""The API's probes and its docs page: /healthz answers while the process serves, /readyz
only while PostgreSQL answers too, and /docs works without internet (every asset it
loads is served by the API itself)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import yaml
from fastapi.testclient import TestClient
from sqlalchemy import create_engine

from pin_orchestration.scraping.api.app import create_app
from pin_orchestration.scraping.store.local import LocalResultStore
from tests.scraping.conftest import TEST_SETTINGS

# Nothing listens on port 1 of loopback: a database that refuses at once.
UNREACHABLE_DB = "postgresql+psycopg://pin:secret@127.0.0.1:1/pin"


def test_healthz_and_readyz_while_the_database_answers(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready"}


def test_readyz_is_503_while_the_database_is_unreachable_and_healthz_stays_200(
    local_store: LocalResultStore,
) -> None:
    engine = create_engine(UNREACHABLE_DB, connect_args={"connect_timeout": 2})
    with TestClient(create_app(lambda: engine, local_store, TEST_SETTINGS)) as cut_off:
        assert cut_off.get("/healthz").status_code == 200
        ready = cut_off.get("/readyz")
        assert ready.status_code == 503
        detail = ready.json()["detail"]
        assert "database unreachable" in detail and "127.0.0.1:1" in detail
        assert "secret" not in ready.text


def test_docs_page_loads_every_asset_from_the_api_itself(client: TestClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200
    html = page.text
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert any(a.endswith(".js") for a in assets) and any(a.endswith(".css") for a in assets)
    for asset in assets:
        url = urljoin("http://testserver/docs", asset)
        assert urlsplit(url).netloc == "testserver", f"/docs loads {asset} from elsewhere"
        loaded = client.get(url)
        assert loaded.status_code == 200, asset
        assert len(loaded.content) > 1000, asset
    # The page asks the browser for the schema at a local path, which answers.
    (openapi_url,) = re.findall(r"url: '([^']+)'", html)
    assert client.get(openapi_url).json()["info"]["title"] == "pin-orchestration scraping API"
    assert "cdn" not in html.lower()


def test_the_probes_in_docs_deploy_are_the_ones_the_api_answers(client: TestClient) -> None:
    deploy = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    section = deploy.split("## Probes of the scraping API\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```yaml\n(.*?)```", section, flags=re.DOTALL)
    (container,) = yaml.safe_load(block)["containers"]
    probes = {kind: container[kind]["httpGet"] for kind in ("livenessProbe", "readinessProbe")}
    assert probes["livenessProbe"]["path"] == "/healthz"
    assert probes["readinessProbe"]["path"] == "/readyz"
    assert container["command"][:2] == ["pin", "api"]
    for probe in probes.values():
        assert probe["port"] == container["ports"][0]["containerPort"]
        assert client.get(probe["path"]).status_code == 200


def test_an_unreachable_database_is_a_503_with_retry_after_not_a_500(
    local_store: LocalResultStore,
) -> None:
    """While PostgreSQL cannot be reached (down, restarting, its connections exhausted) a
    client is told to come back, as /readyz tells the load balancer: 503, a problem, a
    Retry-After, nothing of the connection string. A 500 says the request itself broke
    the service, and clients and SDKs do not retry it (seen at load 9-17: 500s from
    GET /jobs/{id}, bench/scraping_api.py)."""
    engine = create_engine(UNREACHABLE_DB, connect_args={"connect_timeout": 2})
    app = create_app(lambda: engine, local_store, TEST_SETTINGS)
    with TestClient(app, raise_server_exceptions=False) as cut_off:
        key = {"Authorization": "Bearer pin_0123456789abcdef0123456789abcdef"}
        answers = [
            cut_off.get("/jobs/3f0c8a53-5f54-4a0e-9d65-0a4c1c5c2f11", headers=key),
            cut_off.post("/jobs", json={"url": "https://e.com/a"}, headers=key),
        ]
    for answer in answers:
        assert answer.status_code == 503, answer.text
        assert answer.headers["content-type"].startswith("application/problem+json")
        assert int(answer.headers["Retry-After"]) >= 1
        assert "database" in answer.json()["detail"]
        assert "secret" not in answer.text
