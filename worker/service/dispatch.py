"""The order a worker reads its model's streams in: the interactive stream first, then the
batch lanes least slack first (``worker.queue.slack.read_order``, the one rule), going on
down the order while the engine has room.

The order is computed from the lanes' figures in Redis (``worker.queue.lanes.lane_states``:
two round trips whatever the number of lanes) and kept for ``refresh_s``; a read that
found less than it asked for makes the next one look again (new lanes appear at once),
but never more often than every ``min_refresh_s``. So reading costs O(1) Redis calls per
job: one XREADGROUP per lane visited, and the order's refresh at most a few times a
second, shared by every job read meanwhile.

Each refresh also reports this worker's measured rate to the model's rate hash: the
estimated work (``worker.protocol.work_estimate``) of the jobs its engine finished per
second of engine step time, smoothed; the order then uses the sum over the model's live
workers. Until any worker measured one the order is earliest deadline first.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from worker.queue.lanes import lane_states, model_rate, report_rate
from worker.queue.slack import read_order
from worker.service.runtime import WorkerRuntime

MIN_BUSY_S = 2.0  # engine-seconds a rate sample spans at least
SMOOTHING = 0.3  # weight of the newest sample


class Dispatch:
    """The intake's read order, refreshed from Redis. ``work_totals`` gives the engine
    loop's running totals: (estimated work of the jobs it finished, engine-seconds)."""

    def __init__(
        self,
        rt: WorkerRuntime,
        work_totals: Callable[[], tuple[float, float]],
        *,
        refresh_s: float = 1.0,
        min_refresh_s: float = 0.25,
    ) -> None:
        self.rt = rt
        self._totals = work_totals
        self.refresh_s, self.min_refresh_s = refresh_s, min_refresh_s
        self._lanes: list[str] = []  # lanes with entries to read, in read order
        self._drained: list[str] = []  # the other listed lanes (watched while blocking)
        self._refreshed = -float("inf")  # monotonic time of the last refresh
        self._stale = True
        self._since: tuple[float, float] = (0.0, 0.0)  # totals at the last rate sample
        self.rate: float | None = None  # this worker's measured rate (tokens per second)
        self.model_rate: float | None = None  # the model's, at the last refresh

    def streams(self) -> list[str]:
        """The streams to read, in order: the interactive one, then the lanes that have
        entries to read."""
        now = time.monotonic()
        since = now - self._refreshed
        if since >= self.refresh_s or (self._stale and since >= self.min_refresh_s):
            self._refresh()
            self._refreshed, self._stale = now, False
        return [self.rt.keys.interactive, *self._lanes]

    def watched(self) -> list[str]:
        """The streams a blocking read waits on: those of :meth:`streams` and the listed
        lanes left with nothing to read (a publish into one wakes the reader at once; a
        lane made since the last refresh is seen at the next)."""
        return [*self.streams(), *self._drained]

    def read_short(self) -> None:
        """A read found less than it asked for: look at the lanes again soon."""
        self._stale = True

    def _refresh(self) -> None:
        self._measure()
        r, keys = self.rt.redis, self.rt.keys
        if self.rate is not None:
            report_rate(redis_client=r, keys=keys, consumer=self.rt.consumer, rate=self.rate)
        lanes = lane_states(redis_client=r, keys=keys)
        self.model_rate = model_rate(redis_client=r, keys=keys) if lanes else None
        order = read_order(lanes, now=time.time(), rate=self.model_rate)
        self._lanes = [lane.stream for lane in order]
        reading = set(self._lanes)
        self._drained = [lane.stream for lane in lanes if lane.stream not in reading]

    def _measure(self) -> None:
        """Fold the engine's work since the last sample into the rate, once the sample
        spans ``MIN_BUSY_S`` engine-seconds and some job finished in it (a sample of long
        jobs spans until one does, so none is counted twice or left out)."""
        work, busy = self._totals()
        last_work, last_busy = self._since
        if busy - last_busy < MIN_BUSY_S or work <= last_work:
            return
        sample = (work - last_work) / (busy - last_busy)
        self._since = (work, busy)
        self.rate = sample if self.rate is None else (
            SMOOTHING * sample + (1 - SMOOTHING) * self.rate
        )
