"""What a client's receiver does with a delivery: verify it with the maintained Standard
Webhooks libraries (`standardwebhooks`, and `svix`'s `Webhook.verify`), never with our own
HMAC code, so a test passing means those libraries accept what we send."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping

import standardwebhooks
import svix.webhooks
from sqlalchemy import Engine, text

from pin_orchestration.devstack.standins.webhook_receiver import Received


def refusals(secret: str, body: bytes, headers: Mapping[str, str]) -> list[str]:
    """Which libraries refuse the delivery under `secret` ([] when both accept it)."""
    refused = []
    try:
        standardwebhooks.Webhook(secret).verify(body, dict(headers))
    except standardwebhooks.WebhookVerificationError:
        refused.append("standardwebhooks")
    try:
        svix.webhooks.Webhook(secret).verify(body, dict(headers))
    except svix.webhooks.WebhookVerificationError:
        refused.append("svix")
    return refused


def verifies(secret: str, received: Received) -> bool:
    """Both libraries accept it (one accepting and the other not fails the test)."""
    refused = refusals(secret, received.body, received.headers)
    assert refused in ([], ["standardwebhooks", "svix"]), f"the libraries disagree: {refused}"
    return not refused


def assert_every_delivery_verifies(engine: Engine, deliveries: Iterable[Received]) -> None:
    """Each delivery verifies with its tenant's current secret, or with the one a rotation
    replaced (a delivery signed before the rotation)."""
    for received in deliveries:
        job_id = uuid.UUID(json.loads(received.body)["id"])
        with engine.connect() as conn:
            secrets = conn.execute(
                text(
                    "SELECT t.webhook_secret, t.webhook_secret_previous FROM scraping.jobs j "
                    "JOIN scraping.tenants t ON t.id = j.tenant_id WHERE j.id = :id"
                ),
                {"id": job_id},
            ).one()
        assert any(s is not None and verifies(s, received) for s in secrets), (
            f"the delivery of job {job_id} does not verify with its tenant's secret"
        )
