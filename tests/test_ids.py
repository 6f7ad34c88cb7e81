from __future__ import annotations

import os
import random
import time
import uuid

import pytest

from pin_orchestration.platform import ids
from pin_orchestration.platform.ids import uuid7


def test_uuid7_has_version_variant_and_orders_by_time() -> None:
    rand = random.Random(1)
    earlier, later = uuid7(1_700_000_000_000, rand), uuid7(1_700_000_000_001, rand)
    assert earlier.version == 7 and earlier.variant == uuid.RFC_4122
    assert earlier < later
    assert int.from_bytes(earlier.bytes[:6]) == 1_700_000_000_000


def test_uuid7_is_deterministic_for_a_seeded_source() -> None:
    assert uuid7(42, random.Random(7)) == uuid7(42, random.Random(7))
    assert uuid7() != uuid7()


def test_uuid7s_are_distinct_v7_ids_of_this_millisecond_from_one_entropy_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # os.urandom gives up the GIL: read 400 times, a batch waited its turn 400 times behind
    # the API's event loop (py-spy at the seed's peak: a fifth of POST /jobs/batch).
    reads: list[int] = []
    real_urandom = os.urandom

    def counted_urandom(size: int) -> bytes:
        reads.append(size)
        return real_urandom(size)

    monkeypatch.setattr(ids.os, "urandom", counted_urandom)
    before = int(time.time() * 1000)
    batch = ids.uuid7s(400)
    after = int(time.time() * 1000)
    assert len(reads) == 1
    assert len(set(batch)) == 400
    assert all(u.version == 7 and u.variant == uuid.RFC_4122 for u in batch)
    assert all(before <= int.from_bytes(u.bytes[:6]) <= after for u in batch)
    assert ids.uuid7s(0) == []
