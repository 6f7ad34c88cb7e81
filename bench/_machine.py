"""What the machine did during a measurement: the share of CPU time the hypervisor gave
to other guests (steal) and the share this guest was busy, from /proc/stat. A run whose
steal is high measured the neighbours as much as the code: print it beside the figures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

_PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class CpuTimes:
    busy: int
    idle: int
    steal: int

    @classmethod
    def now(cls) -> CpuTimes | None:
        """The machine's CPU ticks so far; None where /proc/stat is missing (not Linux)."""
        try:
            first = _PROC_STAT.read_text().split("\n", 1)[0].split()
        except OSError:
            return None
        # cpu user nice system idle iowait irq softirq steal guest guest_nice
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in first[1:9])
        return cls(busy=user + nice + system + irq + softirq, idle=idle + iowait, steal=steal)


def cpu_shares_since(before: CpuTimes | None) -> str:
    """'busy 63 %, steal 4 %' of the machine's CPU time since `before` ('' off Linux)."""
    after = CpuTimes.now()
    if before is None or after is None:
        return ""
    busy, idle, steal = (
        after.busy - before.busy,
        after.idle - before.idle,
        after.steal - before.steal,
    )
    total = max(busy + idle + steal, 1)
    return f"busy {100 * busy / total:.0f} %, steal {100 * steal / total:.0f} %"
