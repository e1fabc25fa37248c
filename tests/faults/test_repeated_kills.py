"""One worker killed with -9 three times in one run, restarted under the same name after
each kill: every job ends with exactly one result, none failed by the kills (a kill is not
the jobs' fault: redelivered jobs run again in cohorts, and the evidence of three deaths
never adds up to a dead letter).

CI runs 120 jobs; ``make faults`` runs the issue's 500 (``INFLIGHT_FAULT_KILL_JOBS``)."""

from __future__ import annotations

import os

import psycopg
import pytest

import tests.service.test_worker_failures as wf
from tests.service.conftest import REDIS_URL
from tests.service.helpers import prompt_jobs, start_worker, wait_for
from worker.jobs.enqueue import enqueue
from worker.queue.group import ensure_groups

pytestmark = pytest.mark.services

N_JOBS = int(os.environ.get("INFLIGHT_FAULT_KILL_JOBS", "120"))
KILLS = 3


def test_a_worker_killed_three_times_loses_and_repeats_nothing(
    migrated_pg, session_factory, redis_client, keys, tmp_path
) -> None:
    with psycopg.connect(migrated_pg, autocommit=True) as conn:
        conn.execute(wf.AUDIT_SQL)
    ensure_groups(redis_client=redis_client, keys=keys)
    enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys,
            jobs=prompt_jobs(N_JOBS, max_tokens=12))
    log = tmp_path / "worker.log"
    done_at_kill = []
    for kill in range(KILLS + 1):
        worker = start_worker(db_url=migrated_pg, redis_url=REDIS_URL, prefix=keys.prefix,
                              name="k", log_path=log, **wf.PACED)
        try:
            if kill == KILLS:  # the last life runs everything left
                wait_for(lambda: wf._done(session_factory, N_JOBS), timeout=600,
                         what="every job to end after the kills")
                break
            target = (kill + 1) * N_JOBS // (KILLS + 2)  # a further fifth each time
            wait_for(lambda t=target: wf._counts(session_factory).get("succeeded", 0) >= t,
                     timeout=300, what=f"{target} results before kill {kill + 1}")
            worker.kill()  # SIGKILL mid-run: held entries stay pending for the next life
            worker.wait(10)
            done_at_kill.append(wf._counts(session_factory).get("succeeded", 0))
        finally:
            if kill == KILLS:
                assert wf._stop(worker) == 0
            elif worker.poll() is None:
                worker.kill()
    assert all(n < N_JOBS for n in done_at_kill), f"all done before a kill: {done_at_kill}"
    assert wf._counts(session_factory) == {"succeeded": N_JOBS}
    wf._assert_each_result_written_once(migrated_pg, N_JOBS)
    with psycopg.connect(migrated_pg) as conn:
        dead = conn.execute("SELECT count(*) FROM jobs WHERE error IS NOT NULL").fetchone()[0]
    assert dead == 0
