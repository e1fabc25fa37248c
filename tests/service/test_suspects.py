"""Evidence against redelivered entries (``worker.queue.suspects``) on the real Redis: a run
is opened before a cohort starts and dropped when the run ends (ack, hand-back, dead-letter),
so a record found on redelivery is proof that the worker died with the entry."""

from __future__ import annotations

import pytest

from tests.service.helpers import prompt_jobs
from worker.jobs.dead_letter import dead_letter
from worker.jobs.enqueue import enqueue
from worker.queue.consumer import ack, read_new
from worker.queue.group import ensure_groups
from worker.queue.reissue import reissue_entries
from worker.queue.suspects import (
    CohortChoice,
    Evidence,
    Run,
    choose_cohort,
    open_runs,
    read_evidence,
)

pytestmark = pytest.mark.services


def test_cohorts_halve_with_each_death_and_a_lone_death_convicts() -> None:
    assert Evidence().next_cohort_size(40) == 40  # no death seen yet: all the room there is
    assert not Evidence().crashed_alone
    died_in_40 = Evidence([Run("w1", 40, 0.0)])
    assert died_in_40.next_cohort_size(64) == 20 and died_in_40.next_cohort_size(8) == 8
    died_in_3 = Evidence([*died_in_40.runs, Run("w2", 3, 1.0)])
    assert died_in_3.next_cohort_size(64) == 2 and not died_in_3.crashed_alone
    alone = Evidence([*died_in_3.runs, Run("w3", 1, 2.0)])
    assert alone.crashed_alone
    text = alone.describe()
    assert "3 isolated run(s)" in text and "group of 40" in text and "alone on w3" in text


def test_a_run_is_remembered_until_it_ends(session_factory, redis_client, keys) -> None:
    ensure_groups(redis_client=redis_client, keys=keys)
    enqueue(session_factory=session_factory, redis_client=redis_client, keys=keys, jobs=prompt_jobs(3))
    got = read_new(redis_client=redis_client, keys=keys, consumer="c", count=3)
    entries = [(d.stream, d.entry_id) for d in got]
    assert all(not ev.runs for ev in read_evidence(redis_client=redis_client, keys=keys, entries=entries).values())

    open_runs(redis_client=redis_client, keys=keys, cohort={e: Evidence() for e in entries}, worker="w1", now=5.0)
    seen = read_evidence(redis_client=redis_client, keys=keys, entries=entries)
    assert all(ev.runs == [Run("w1", 3, 5.0)] for ev in seen.values())  # the worker "died"
    open_runs(redis_client=redis_client, keys=keys, cohort={entries[0]: seen[entries[0]]}, worker="w2", now=6.0)
    assert read_evidence(redis_client=redis_client, keys=keys, entries=entries[:1])[entries[0]].runs == [
        Run("w1", 3, 5.0), Run("w2", 1, 6.0)]

    # each way a run ends drops its record: written and acked, handed back, dead-lettered
    ack(redis_client=redis_client, keys=keys, entries=[(*entries[0], got[0].job_id)])
    reissue_entries(redis_client=redis_client, keys=keys, deliveries=[got[1]])
    dead_letter(redis_client=redis_client, session_factory=session_factory, keys=keys, deliveries=[got[2]],
                reason="test", evidence={entries[2]: seen[entries[2]].describe()})
    assert redis_client.hlen(keys.suspects) == 0
    ((_, dead),) = redis_client.xrange(keys.dead)
    assert "group of 3 suspects on w1" in dead["dead_evidence"]


def test_an_unreadable_record_counts_as_none(redis_client, keys) -> None:
    redis_client.hset(keys.suspects, "s 1-0", "not json")
    assert read_evidence(redis_client=redis_client, keys=keys, entries=[("s", "1-0")])[("s", "1-0")].runs == []


def test_the_next_cohort_follows_the_evidence() -> None:
    entries = [("s", f"{i}-0") for i in range(30)]
    none = {e: Evidence() for e in entries}
    assert choose_cohort(entries, none, 12).cohort == entries[:12]  # no death seen: the room
    assert choose_cohort(entries, none, 0) == CohortChoice()  # beside the batch: wait for room
    died = {**none, **{e: Evidence([Run("w", 8, 0.0)]) for e in entries[20:28]}}
    assert choose_cohort(entries, died, 64).cohort == entries[20:24]  # most evidence first, half
    lone = {**died, entries[25]: Evidence([Run("w", 2, 0.0)])}
    assert choose_cohort(entries, lone, 0).cohort == [entries[25]]  # alone needs no room
    guilty = {**lone, entries[3]: Evidence([Run("w", 1, 0.0)])}
    assert choose_cohort(entries, guilty, 64) == CohortChoice(guilty=[entries[3]])
