"""The injectable clock the fault suite jumps: the machine's time plus an offset kept in a
file, so the scenario and the processes it starts share one clock it can move (the
machine's own clock is never touched)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path


class JumpingClock:
    def __init__(self, path: Path) -> None:
        self.path = path

    def set(self, offset_seconds: float) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{offset_seconds}\n")
        tmp.replace(self.path)  # atomic: a reader sees the old offset or the new one

    def jump(self, seconds: float) -> None:
        self.set(self.offset() + seconds)

    def offset(self) -> float:
        try:
            return float(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return 0.0

    def now(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=self.offset())
