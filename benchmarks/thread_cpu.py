"""CPU time of every thread of this process over an interval, by thread name.

    with ThreadCpu() as cpu:
        ...                       # run a worker in this process
    cpu.seconds                   # {"MainThread": 41.2, "output-writer": 1.3, "omp": 40.7, ...}

Samples ``/proc/self/task/<tid>/stat`` (user + system ticks) every ``interval`` seconds
and at the end, so threads that start and stop inside the interval are counted up to
their last sample (a thread that lives less than one interval may be missed). Python
threads are named by their ``threading`` name; other threads (torch's OpenMP workers,
library threads) are counted together under ``omp+native``. Linux only.
"""

from __future__ import annotations

import threading
from pathlib import Path

from benchmarks.process_cpu import TICKS_PER_S, read_stat

NATIVE = "omp+native"


def _thread_ticks() -> dict[int, int]:
    """utime + stime ticks of every live thread of this process, by tid."""
    out: dict[int, int] = {}
    for task in Path("/proc/self/task").iterdir():
        if (stat := read_stat(task / "stat")) is not None:
            out[int(task.name)] = stat[2]
    return out


class ThreadCpu:
    """CPU seconds per thread name between ``__enter__`` and ``__exit__``."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.seconds: dict[str, float] = {}
        self._start: dict[int, int] = {}
        self._last: dict[int, int] = {}
        self._names: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="thread-cpu-sampler", daemon=True)

    def _sample(self) -> None:
        for t in threading.enumerate():
            if t.native_id is not None:
                self._names.setdefault(t.native_id, t.name)
        self._last.update(_thread_ticks())

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> ThreadCpu:
        self._start = _thread_ticks()
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        own = self._thread.native_id
        totals: dict[str, float] = {}
        for tid, ticks in self._last.items():
            if tid == own:
                continue
            name = self._names.get(tid, NATIVE)
            spent = (ticks - self._start.get(tid, 0)) / TICKS_PER_S
            totals[name] = totals.get(name, 0.0) + spent
        self.seconds = {k: round(v, 2) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}
