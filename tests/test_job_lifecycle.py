"""The job status transition table: terminal statuses are final, and the sets the store's
writes use come from it."""

from __future__ import annotations

from worker.store.job_lifecycle import OPEN, TERMINAL, TRANSITIONS, is_allowed, sources


def test_terminal_statuses_are_final_and_open_ones_can_end_every_way() -> None:
    assert set(TERMINAL) == {"succeeded", "failed", "cancelled"} and set(OPEN) == {"queued", "running"}
    for ended in TERMINAL:
        assert not any(is_allowed(ended, other) for other in TRANSITIONS)  # not even to itself
    for status in OPEN:
        assert all(is_allowed(status, ended) for ended in TERMINAL)


def test_the_writes_start_only_from_what_the_table_allows() -> None:
    assert sources("running") == ("queued", "running")  # a redelivery re-starts a running job
    assert sources("queued") == ("running",)  # only a started job is handed back
    assert set(sources("succeeded")) == set(sources("failed")) == set(sources("cancelled")) == set(OPEN)
    assert not is_allowed("queued", "queued")
