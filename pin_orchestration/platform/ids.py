"""Identifiers the platform uses: UUIDv7, time-ordered, so keyset walks by id follow
creation order (seed 000 relies on it for the reconcile cursor)."""

from __future__ import annotations

import os
import random
import time
import uuid

_RANDOM_BYTES = 10  # 80 bits read, the top 74 kept


def uuid7(unix_ms: int | None = None, rand: random.Random | None = None) -> uuid.UUID:
    """A UUIDv7 (RFC 9562): 48-bit Unix-ms timestamp, version 7, variant, 74 random bits."""
    ms = int(time.time() * 1000) if unix_ms is None else unix_ms
    random_bits = rand.getrandbits(74) if rand else int.from_bytes(os.urandom(_RANDOM_BYTES)) >> 6
    return _uuid7(ms, random_bits)


def uuid7s(count: int) -> list[uuid.UUID]:
    """`count` UUIDv7s of this millisecond, their random bits from one os.urandom call:
    each call gives up the GIL, and a batch of 400 ids read one by one waited its turn 400
    times behind the API's event loop."""
    ms = int(time.time() * 1000)
    entropy = os.urandom(_RANDOM_BYTES * count)
    return [
        _uuid7(ms, int.from_bytes(entropy[i : i + _RANDOM_BYTES]) >> 6)
        for i in range(0, len(entropy), _RANDOM_BYTES)
    ]


def _uuid7(ms: int, random_bits: int) -> uuid.UUID:
    value = (ms & (2**48 - 1)) << 80
    value |= 0x7 << 76
    value |= (random_bits >> 62) << 64  # rand_a: 12 bits
    value |= 0b10 << 62
    value |= random_bits & (2**62 - 1)  # rand_b: 62 bits
    return uuid.UUID(int=value)
