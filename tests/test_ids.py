from __future__ import annotations

import random
import uuid

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
