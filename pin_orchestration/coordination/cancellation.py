"""Turn SIGTERM/SIGINT into a stop request that long loops check between units of work.

Dagster terminates a run by signalling its process; without this the interrupt would land
mid-batch. With it, the current batch commits and the loop stops at the next boundary.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def stop_requested_on_signals(*, reraise: bool = False) -> Iterator[threading.Event]:
    """Yield an event set by SIGTERM/SIGINT while the block runs.

    With `reraise`, a signal that arrived is delivered again to the previous handler after
    the block, so a framework that owns the process (Dagster marks the run cancelled) still
    sees it — once the work is at a safe boundary.
    """
    stop = threading.Event()
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        # Signal handlers can only be installed on the main thread; the caller still gets
        # an event it may set itself.
        yield stop
        return

    def request_stop(signo: int, _frame: FrameType | None) -> None:
        received.append(signo)
        stop.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if reraise and received:
            signal.raise_signal(received[0])
