"""The worker's inbox has one owner: the intake puts while the engine loop takes and
removes cancelled jobs, from two threads, and every job comes out exactly once (a deque
shared without its lock raised "deque mutated during iteration" here)."""

from __future__ import annotations

import threading

from worker.queue.delivery import Delivery
from worker.service.held_jobs import HeldJob
from worker.service.inbox import Inbox

N = 5_000


def _job(i: int) -> HeldJob:
    return HeldJob(job_id=f"j{i}", stream="s", entry_id=f"{i}-0",
                   delivery=Delivery(stream="s", entry_id=f"{i}-0", fields={}, message=None))


def test_put_and_take_from_two_threads() -> None:
    inbox = Inbox()
    out: list[str] = []
    done = threading.Event()
    errors: list[BaseException] = []

    def producer() -> None:
        try:
            for start in range(0, N, 50):
                inbox.put(_job(i) for i in range(start, start + 50))
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    cancelled = {f"j{i}" for i in range(0, N, 7)}

    def consumer() -> None:
        try:
            while not done.is_set() or len(inbox):
                out.extend(h.job_id for h in inbox.take_ids(cancelled))
                out.extend(h.job_id for h in inbox.take(3))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=producer), threading.Thread(target=consumer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    out.extend(h.job_id for h in inbox.take_all())
    assert sorted(out) == sorted(f"j{i}" for i in range(N))
