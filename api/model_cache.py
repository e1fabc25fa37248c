"""The models the workers served lately, as the submission path asks for them on every
request: read from the ``workers`` table at most every ``ttl_s`` seconds, and again at once
when a request names a model the cached answer lacks (a worker that just registered)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from worker.store.crud.served_models import ModelsSeen, models_seen


class ModelCache:
    """A short-lived copy of :func:`worker.store.crud.served_models.models_seen`."""

    def __init__(self, ttl_s: float = 2.0) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._seen: ModelsSeen | None = None
        self._at = 0.0

    def seen(
        self, sessions: sessionmaker[Session], *, live_s: float, recent_s: float,
        wanted: str | None = None,
    ) -> ModelsSeen:
        """The models seen, read again when the copy is older than ``ttl_s``, lacks
        ``wanted`` or (``wanted`` None) holds no model at all."""
        with self._lock:
            seen, at = self._seen, self._at
        fresh = seen is not None and time.monotonic() - at < self.ttl_s
        if fresh and seen is not None and (wanted in seen.recent if wanted else seen.recent):
            return seen
        with sessions() as session:
            seen = models_seen(session=session, live_within=timedelta(seconds=live_s),
                               recent_within=timedelta(seconds=recent_s))
        with self._lock:
            self._seen, self._at = seen, time.monotonic()
        return seen
