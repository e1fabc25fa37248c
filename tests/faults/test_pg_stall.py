"""PostgreSQL unreachable for longer than the take-over idle time does not cause double
runs: the worker cut off from PostgreSQL (its queries hang: a partition, not a refusal)
keeps its held entries touched from a Redis-only thread, so the other worker never takes
them over; after the outage every job has one result and one attempt.

In CI the outage is scaled down to 12 s: what matters is outage > claim idle time (4 s
here), and it lasts three times that. ``make faults`` runs the issue's full 90 s
(``INFLIGHT_FAULT_PG_OUTAGE_S``)."""

from __future__ import annotations

import os
import time

import pytest

import tests.service.test_worker_failures as wf
from tests.faults.processes import StallingProxy
from tests.service.conftest import REDIS_URL
from tests.service.helpers import batch_pending_by_consumer, prompt_jobs, start_worker, wait_for
from worker.jobs.enqueue import enqueue
from worker.queue.group import ensure_groups

pytestmark = pytest.mark.services

N_JOBS = 60
OUTAGE_S = float(os.environ.get("INFLIGHT_FAULT_PG_OUTAGE_S", "12"))  # CI: 3 x claim idle
FLAGS = ["--attention-backend", "torch", "--max-num-seqs", "4", "--claim-idle-ms", "4000"]


def test_postgres_stalled_for_one_worker_no_takeover(
    migrated_pg, session_factory, redis_client, keys, tmp_path
) -> None:
    import psycopg

    with psycopg.connect(migrated_pg, autocommit=True) as conn:
        conn.execute(wf.AUDIT_SQL)
    ensure_groups(redis_client=redis_client, keys=keys)
    proxy = StallingProxy(5432)
    via_proxy = migrated_pg.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    a = start_worker(db_url=via_proxy, redis_url=REDIS_URL, prefix=keys.prefix, name="a",
                     log_path=log_a, extra=FLAGS)
    b = start_worker(db_url=migrated_pg, redis_url=REDIS_URL, prefix=keys.prefix, name="b",
                     log_path=log_b, extra=FLAGS)
    try:
        wait_for(lambda: "(consumer a) starting" in log_a.read_text()
                 and "(consumer b) starting" in log_b.read_text(), timeout=300,
                 what="both workers to start")
        enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys,
                jobs=prompt_jobs(N_JOBS, max_tokens=24))
        wait_for(lambda: wf._counts(session_factory).get("succeeded", 0) >= 8, timeout=300,
                 what="first results")
        proxy.stall()
        stalled_at = time.monotonic()
        wait_for(lambda: batch_pending_by_consumer(redis_client, keys).get("a", 0) > 0,
                 timeout=10, what="a to hold entries during the outage", interval=0.05)
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - stalled_at)))
        assert a.poll() is None, "worker a died during the outage"
        proxy.resume()
        wait_for(lambda: wf._done(session_factory, N_JOBS), timeout=300, what="all jobs to end")
        assert wf._counts(session_factory) == {"succeeded": N_JOBS}
    finally:
        proxy.resume()
        for w in (a, b):
            assert wf._stop(w) == 0
        proxy.close()
    wf._assert_each_result_written_once(migrated_pg, N_JOBS)
    with psycopg.connect(migrated_pg) as conn:
        twice = conn.execute("SELECT id, attempts FROM jobs WHERE attempts <> 1").fetchall()
    assert not twice, f"jobs run more than once: {twice}"
    assert "took over" not in log_b.read_text()
