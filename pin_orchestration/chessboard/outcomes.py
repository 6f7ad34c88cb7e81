"""What the drain reports per project and per tick: read by the metrics, the Dagster drain
run and the command line (its own module so the metrics and the drain do not import
each other)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Literal

from pin_orchestration.chessboard.recalc import RecalcResult

Result = Literal["recalculated", "skipped", "failed"]


@dataclass(frozen=True)
class ProjectOutcome:
    project_id: uuid.UUID
    tenant_id: uuid.UUID
    result: Result
    duration_seconds: float
    requested_count: int
    last_reason: str
    recalc: RecalcResult | None = None
    error: str | None = None
    attempt_count: int = 0
    poisoned: bool = False
    # Raised again during the recalc: the row stays queued for one more recalc.
    requeued: bool = False


@dataclass
class TickResult:
    outcomes: list[ProjectOutcome] = field(default_factory=list)
    stopped: bool = False

    def count(self, result: Result) -> int:
        return sum(1 for o in self.outcomes if o.result == result)

    @property
    def poisoned(self) -> list[ProjectOutcome]:
        return [o for o in self.outcomes if o.poisoned]
