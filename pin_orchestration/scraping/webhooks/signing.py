"""Standard Webhooks 1.0 signing of the completion webhooks (standardwebhooks.com).

What the maintained verifiers (`standardwebhooks`, `svix` and their JavaScript, C#, Go …
ports) check, so a receiver never writes HMAC code: `webhook-id` names the event and stays
the same on every retry of it (the receiver's de-duplication key), `webhook-timestamp` is
when this attempt was signed (Unix seconds; verifiers refuse it beyond 5 minutes), and
`webhook-signature` is `v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<raw body>">`, keyed
with the base64-decoded part of the tenant's `whsec_<base64>` secret. During a secret
rotation one signature per secret, space-separated, so a receiver holding either verifies.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
SECRET_PREFIX = "whsec_"
# Event ids are derived, not stored: the same finish of the same job always has the same id.
_EVENT_NAMESPACE = uuid.UUID("0b5c3a52-51d6-4f3e-9b1e-4c7d1a0e2f18")


def new_secret() -> str:
    """`whsec_` + base64 of 32 random bytes (the key the HMAC is keyed with)."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def secret_key(secret: str) -> bytes:
    """The HMAC key of a `whsec_<base64>` secret: the decoded bytes, as the verifiers do."""
    encoded = secret.removeprefix(SECRET_PREFIX)
    try:
        return base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except binascii.Error as exc:
        raise ValueError(f"webhook secret is not whsec_<base64>: {exc}") from None


def event_id(job_id: uuid.UUID, status: str, finished_at: datetime) -> str:
    """One id per announced finish: retries repeat it; a requeued job that finishes again
    is a new event with a new id."""
    finish = f"{job_id}/{status}/{finished_at.astimezone(UTC).isoformat()}"
    return f"msg_{uuid.uuid5(_EVENT_NAMESPACE, finish).hex}"


def signature(secret: str, msg_id: str, timestamp: str, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    mac = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode("ascii")


def signed_headers(
    secrets_in_use: Sequence[str], msg_id: str, body: bytes, *, now: float
) -> dict[str, str]:
    """The headers of one delivery attempt, signed with every secret in use (the current
    one first, then the one being rotated out)."""
    timestamp = str(int(now))
    return {
        "Content-Type": "application/json",
        ID_HEADER: msg_id,
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: " ".join(
            signature(secret, msg_id, timestamp, body) for secret in secrets_in_use
        ),
    }
