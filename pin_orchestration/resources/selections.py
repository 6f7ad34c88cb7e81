from __future__ import annotations

from dagster import ConfigurableResource
from pydantic import Field

from pin_orchestration.news.selections import STANDIN_URL, SelectionsClient, selections_client


class SelectionsResource(ConfigurableResource):
    """The selections internal API (m2m). Unset fields fall back to PIN_SELECTIONS_URL /
    PIN_SELECTIONS_TOKEN, read when a client is made; with no URL at all, the local
    stand-in that `pin up` starts."""

    url: str | None = Field(
        default=None,
        description="Base URL of selections; empty → PIN_SELECTIONS_URL, else the local "
        f"stand-in at {STANDIN_URL}",
    )
    token: str | None = Field(
        default=None, description="m2m bearer token; empty → PIN_SELECTIONS_TOKEN"
    )
    detach_call_timeout_seconds: float = Field(
        default=5.0, description="Timeout of one detach call (DetachCallTimeout)"
    )

    def get_client(self, pool_size: int) -> SelectionsClient:
        """A client whose connection pool holds `pool_size` connections (one per worker)."""
        return selections_client(
            self.url,
            self.token,
            timeout_seconds=self.detach_call_timeout_seconds,
            pool_size=pool_size,
        )
