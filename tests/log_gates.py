"""A log line as a gate: tests that must wait for something the code only logs (a lock
found lost, a slot not given back) wait on the line, never on the clock."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class LogSeen(logging.Handler):
    """`seen` is set once a record whose message contains any of `needles` is logged."""

    def __init__(self, *needles: str) -> None:
        super().__init__()
        self.needles = needles
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if any(needle in record.getMessage() for needle in self.needles):
            self.seen.set()


@contextmanager
def watching_log(logger_name: str, handler: logging.Handler) -> Iterator[None]:
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
