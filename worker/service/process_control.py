"""How a worker's threads stop, and how they wait out a store that is away until told to.

``Flags``: signal handlers only set flags (``draining``, ``stop_now``); the loops act on
them. ``retry``: a write to a store that may be briefly unreachable (what counts as
unreachable: :func:`worker.jobs.transient.is_transient`) is tried again with backoff until
it succeeds or one of those flags says to give up.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

from worker.jobs.transient import is_transient

T = TypeVar("T")
log = logging.getLogger(__name__)


class Flags:
    """``draining``: stop intake and finish in-flight work; ``stop_now``: stop at once."""

    def __init__(self) -> None:
        self.draining = threading.Event()
        self.stop_now = threading.Event()
        self.signals = 0

    def request_drain(self) -> None:
        """First stop request: drain."""
        self.draining.set()

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        """SIGTERM/SIGINT: the first drains, the second stops at once."""
        self.signals += 1
        if self.signals == 1:
            self.request_drain()
        else:
            self.stop_now.set()
            self.draining.set()

    def install(self) -> None:
        """Route SIGTERM and SIGINT here (call from the main thread)."""
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)


def retry(
    fn: Callable[[], T],
    *,
    what: str,
    stop: threading.Event | None = None,
    first_delay: float = 0.05,
    max_delay: float = 2.0,
) -> T:
    """Call ``fn`` until it succeeds, backing off on transient errors; other errors are
    raised at once. If ``stop`` gets set while waiting, the last error is raised."""
    delay = first_delay
    failures = 0
    while True:
        try:
            result = fn()
        except Exception as exc:
            if not is_transient(exc):
                raise
            failures += 1
            if failures == 1 or failures % 20 == 0:
                log.warning("%s failed (%s); retrying", what, type(exc).__name__)
            if stop is not None and stop.wait(delay):
                raise
            if stop is None:
                time.sleep(delay)
            delay = min(max_delay, delay * 2)
            continue
        if failures:
            log.warning("%s succeeded after %d retries", what, failures)
        return result
