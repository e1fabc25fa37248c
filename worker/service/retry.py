"""Retry with backoff for writes to a store that may be briefly unreachable (what counts as
unreachable: :func:`worker.jobs.transient.is_transient`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from worker.jobs.transient import is_transient

T = TypeVar("T")
log = logging.getLogger(__name__)


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
