"""When a worker run may call a failing database again."""

from __future__ import annotations

import logging
import random
import time

log = logging.getLogger(__name__)

# The longest a worker with free slots waits before asking for due jobs again.
MAX_POLL_SECONDS = 1.0
# Backoff between tries of a database call that failed (claim, renewal, outcome write).
DB_RETRY_FIRST_SECONDS = 0.25
DB_RETRY_MAX_SECONDS = 5.0


class DatabaseBackoff:
    """When a failing database may be tried again: exponential backoff with jitter, reset
    by a success. Shared by the main loop's claims and writes (one database, one verdict)."""

    def __init__(self) -> None:
        self.failures = 0
        self._next_try = 0.0

    def due(self) -> bool:
        return time.monotonic() >= self._next_try

    def wait_seconds(self) -> float:
        return max(self._next_try - time.monotonic(), 0.0) if self.failures else MAX_POLL_SECONDS

    def sleep_until_due(self) -> None:
        time.sleep(max(self._next_try - time.monotonic(), 0.0))

    def succeeded(self) -> None:
        if self.failures:
            log.info("the database answers again after %d failed calls", self.failures)
        self.failures = 0
        self._next_try = 0.0

    def failed(self, what: str, exc: Exception) -> None:
        delay = min(DB_RETRY_FIRST_SECONDS * 2**self.failures, DB_RETRY_MAX_SECONDS)
        delay *= random.uniform(0.5, 1.0)
        self.failures += 1
        self._next_try = time.monotonic() + delay
        # PostgreSQL's hint names the fix where there is one (a claim refused outside READ
        # COMMITTED: which setting to change); the message alone is its first line.
        diag = getattr(getattr(exc, "orig", exc), "diag", None)
        hint = getattr(diag, "message_hint", None)
        log.warning(
            "%s failed (%s: %s)%s; retrying in %.2f s",
            what,
            type(exc).__name__,
            str(exc).splitlines()[0] if str(exc) else "",
            f" ({hint})" if hint else "",
            delay,
        )
