"""Client of the selections internal API (m2m): `POST /internal/snapshots/{id}/detach`.

Detaching an immutable snapshot is idempotent (INV-SNP-005): selections answers 2xx both
for a fresh detach and for a snapshot that is already Detached. Every other answer is
classified so the worker knows whether to retry, and says which (`CallResult.code`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import requests
from requests.adapters import HTTPAdapter

from pin_orchestration.platform import tracing
from pin_orchestration.platform.settings import LOCAL_SELECTIONS_PORT, Settings

STANDIN_URL = f"http://127.0.0.1:{LOCAL_SELECTIONS_PORT}"


class CallKind(StrEnum):
    DETACHED = "detached"  # 2xx: detached now, or already Detached (no-op success)
    TRANSIENT = "transient"  # 5xx, timeout, network: selections is unwell, try again later
    REJECTED = "rejected"  # any other status (4xx, 3xx): selections refused this call


@dataclass(frozen=True)
class CallResult:
    kind: CallKind
    # Class + code, never a body or a secret: "http_200", "http_503", "timeout",
    # "network:ConnectionError".
    code: str

    @property
    def detached(self) -> bool:
        return self.kind == CallKind.DETACHED


class DetachCaller(Protocol):
    # The longest a call can take: a claim leases its row for at least this long.
    timeout_seconds: float

    def detach(self, snapshot_id: uuid.UUID, reason: str) -> CallResult: ...


def classify_status(status_code: int) -> CallResult:
    if 200 <= status_code < 300:
        return CallResult(CallKind.DETACHED, f"http_{status_code}")
    if status_code >= 500:
        return CallResult(CallKind.TRANSIENT, f"http_{status_code}")
    return CallResult(CallKind.REJECTED, f"http_{status_code}")


class SelectionsClient:
    """A pooled `requests.Session` sized for `pool_size` concurrent calls."""

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        timeout_seconds: float = 5.0,
        pool_size: int = 10,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"selections base URL must be http(s)://… (got {base_url!r})")
        if timeout_seconds <= 0:
            raise ValueError(
                f"detach_call_timeout_seconds must be > 0 (got {timeout_seconds}); default is 5"
            )
        self.base_url = base_url.rstrip("/")
        self.timeout_seconds = timeout_seconds
        self.session = requests.Session()
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=max(pool_size, 1))
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"

    def detach_url(self, snapshot_id: uuid.UUID) -> str:
        return f"{self.base_url}/internal/snapshots/{snapshot_id}/detach"

    def detach(self, snapshot_id: uuid.UUID, reason: str) -> CallResult:
        try:
            response = self.session.post(
                self.detach_url(snapshot_id),
                json={"reason": reason},
                timeout=self.timeout_seconds,
                # The attempt's trace context: selections' spans join the attempt's trace.
                headers=tracing.trace_headers(),
            )
        except requests.Timeout:
            return CallResult(CallKind.TRANSIENT, "timeout")
        except requests.RequestException as exc:
            return CallResult(CallKind.TRANSIENT, f"network:{type(exc).__name__}")
        # Drain the body so the pooled connection can be reused.
        response.close()
        return classify_status(response.status_code)

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> SelectionsClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def selections_client(
    url: str | None, token: str | None, *, timeout_seconds: float, pool_size: int
) -> SelectionsClient:
    """A client of `url` (else PIN_SELECTIONS_URL, read now; else the local stand-in that
    `pin up` starts) whose pool holds `pool_size` connections (one per worker)."""
    settings = Settings.from_env()
    return SelectionsClient(
        url or settings.selections_url or STANDIN_URL,
        token or settings.selections_token,
        timeout_seconds=timeout_seconds,
        pool_size=pool_size,
    )
