"""One deadline for a whole fetch (redirects, headers, body), kept by a watchdog thread that
shuts the sockets of a fetch that outlives it, or whose `should_stop` turned true: a target
trickling bytes, or accepting and never answering, holds no slot past it."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

# The fetch this thread runs: its `deadline`, and whether its request went out on a kept
# connection (`kept_connection`), read by the guarded connections and pools.
current_fetch = threading.local()


class Deadline:
    """The end of one fetch, and the connections (with their sockets) it is using.

    Sockets are kept beside their connection because http.client lets go of a connection's
    socket (`conn.sock = None`) as soon as an answer says the connection will close, while
    the body is still read from it.
    """

    def __init__(self, at: float, should_stop: Callable[[], bool] | None = None) -> None:
        self.at = at
        self.should_stop = should_stop
        # Shut because should_stop turned true (the fetch is `cancelled`, not timed out).
        self.stopped = False
        self.expired = False
        self._finished = False
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[Any, list[socket.socket]]] = {}

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def watch(self, conn: Any) -> None:
        """Called when a fetch takes `conn` from its pool and again when `conn` connects."""
        with self._lock:
            if self._finished:
                return
            conn._pin_deadline = self
            _, sockets = self._watched.setdefault(id(conn), (conn, []))
            sock = conn.sock
            if sock is not None and all(sock is not known for known in sockets):
                sockets.append(sock)
            if self.expired:
                _shut(conn, sockets)

    def unwatch(self, conn: Any) -> None:
        with self._lock:
            if getattr(conn, "_pin_deadline", None) is self:
                conn._pin_deadline = None
            self._watched.pop(id(conn), None)

    def expire(self) -> bool:
        """Shut every socket of the fetch; `False` once the fetch is over."""
        with self._lock:
            if self._finished:
                return False
            self.expired = True
            for conn, sockets in self._watched.values():
                _shut(conn, sockets)
            return True

    def look(self, now: float, reshut_seconds: float, poll_seconds: float) -> float | None:
        """The watchdog's look at this fetch: shut it when its deadline has passed or
        `should_stop` turned true (again while it is not over: a socket may still have been
        connecting). When to look again, or `None` once the fetch is over."""
        if self._finished:
            return None
        if not self.expired and now < self.at:
            if not self._stop_asked():
                return min(self.at, now + poll_seconds)
            self.stopped = True
        return now + reshut_seconds if self.expire() else None

    def _stop_asked(self) -> bool:
        if self.should_stop is None:
            return False
        try:
            return self.should_stop()
        except Exception:
            # The fetch's own thread calls it too, and gets the error there; the watchdog
            # must outlive it for every other fetch.
            return False

    def finish(self) -> None:
        with self._lock:
            self._finished = True
            for conn, _ in self._watched.values():
                if getattr(conn, "_pin_deadline", None) is self:
                    conn._pin_deadline = None
            self._watched.clear()


def _shut(conn: Any, sockets: list[socket.socket]) -> None:
    current = conn.sock
    for sock in [*sockets, *([current] if current is not None else [])]:
        # The plain socket's shutdown even for TLS: it wakes the thread blocked in recv
        # without tearing the SSL object out from under it. A socket already closed has
        # given up its descriptor (fileno -1), so this never reaches another connection.
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


class Watchdog:
    """One thread per Fetcher that expires deadlines, so a fetch blocked in a receive (a
    target trickling headers or body) is woken at its deadline instead of holding a slot.
    An expired fetch is shut again every `_RESHUT_SECONDS` until it finishes, which covers a
    socket that was still connecting at the first expiry."""

    _RESHUT_SECONDS = 0.5
    # How often a fetch's should_stop is looked at while it waits (a stop, a cancel, a
    # lease in doubt): a target that accepts and never answers no longer holds the slot
    # to the deadline.
    _STOP_POLL_SECONDS = 0.25
    _TICK_SECONDS = 0.05

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()
        self._wakeup = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self, at: float, should_stop: Callable[[], bool] | None = None) -> Deadline:
        deadline = Deadline(at, should_stop)
        first = at if should_stop is None else min(at, time.monotonic() + self._STOP_POLL_SECONDS)
        with self._wakeup:
            if self._stopped:
                raise RuntimeError("the fetcher is closed")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="pin-fetch-watchdog", daemon=True
                )
                self._thread.start()
            heapq.heappush(self._heap, (first, next(self._order), deadline))
            if self._heap[0][2] is deadline:
                self._wakeup.notify()
        return deadline

    def stop(self) -> None:
        with self._wakeup:
            self._stopped = True
            self._wakeup.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._wakeup:
                while True:
                    if self._stopped:
                        return
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        break
                    self._wakeup.wait(self._heap[0][0] - now if self._heap else None)
                due = []
                while self._heap and self._heap[0][0] <= now:
                    due.append(heapq.heappop(self._heap)[2])
            # Outside the lock: should_stop is the caller's code.
            again = [
                (deadline.look(now, self._RESHUT_SECONDS, self._STOP_POLL_SECONDS), deadline)
                for deadline in due
            ]
            with self._wakeup:
                for at, deadline in again:
                    if at is not None:
                        heapq.heappush(self._heap, (at, next(self._order), deadline))
            # A worker's hundreds of fetches want a look every _STOP_POLL_SECONDS each: taken
            # a tick apart in batches, they cost tens of wake-ups a second, not one each
            # (a thousand a second, each a switch and a turn of the GIL). A deadline or a
            # stop is seen at most a tick late.
            time.sleep(self._TICK_SECONDS)
