"""How many corrections a claim fair by jobs started pays when it keeps, per domain queue,
a lower bound of its tenant's start tag (issue 30 item 7; bench/README.md, "fair by jobs
started"). A simulation, no database: single-tenant domain queues all with room, a heap of
(stored key, domain); a pick takes the smallest stored key, and starts that tenant's job
when the tenant's start tag is within B of the probe's lower bound (B = 0: exact, the
0027 claim), otherwise raises the queue's key to the tag (one correction) and probes again.

    python bench/fair_started_corrections.py [--picks 20000]

Prints (in ~1 minute) corrections per job started and the worst lag of a start behind the smallest
start tag among tenants with claimable work (the fairness bound B buys).
"""

from __future__ import annotations

import argparse
import heapq
from collections.abc import Iterable


def run(tenant_domains: dict[int, Iterable[int]], picks: int, slack: float) -> tuple[float, float]:
    start = {t: 0.0 for t in tenant_domains}
    heap = [(0.0, d, t) for t, ds in tenant_domains.items() for d in ds]
    heapq.heapify(heap)
    clock = 0.0  # a lower bound of every claimable tenant's tag: the probe's, never the pick's
    corrections = 0
    worst = 0.0
    started = 0
    while started < picks:
        key, domain, tenant = heapq.heappop(heap)
        bound = max(clock, key)
        tag = max(start[tenant], clock)
        if tag <= bound + slack:
            true_min = min(max(s, clock) for s in start.values()) if len(start) < 50 else bound
            worst = max(worst, tag - true_min)
            start[tenant] = tag + 1
            clock = bound
            started += 1
            heapq.heappush(heap, (start[tenant], domain, tenant))
        else:
            corrections += 1
            heapq.heappush(heap, (tag, domain, tenant))
    return corrections / picks, worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--picks", type=int, default=20000)
    args = parser.parse_args()
    cases: list[tuple[str, dict[int, Iterable[int]]]] = [
        ("one tenant, 64 domains with room", {0: range(64)}),
        ("one tenant, 1,000 domains with room", {0: range(1000)}),
        ("two tenants: 1,000 domains and 1", {0: range(1000), 1: [10**6]}),
        ("2,000 tenants x 10 domains", {t: range(t * 10, t * 10 + 10) for t in range(2000)}),
    ]
    for name, tenant_domains in cases:
        for slack in (0, 1, 8, 64):
            per_start, worst = run(tenant_domains, args.picks, slack)
            print(
                f"{name:40s} B={slack:3d}: corrections per start {per_start:8.2f}"
                f"   worst lag {worst:.0f}"
            )


if __name__ == "__main__":
    main()
