"""Property-based, end to end (issue 26): Hypothesis draws what the API accepts (``POST
/v1/jobs`` bodies from the route's OpenAPI schema and the parser's grammar, OpenAI Batch
input files of both line forms with bad lines among them) and what happens to it (a
plain run, an expansion that dies after some chunks, an expiry or a cancel between two
chunks, a finalize that fails once), then runs it through batch expansion, a real worker
on the tiny model, finalize and webhook delivery to a local receiver (one that refuses
first attempts, one that is down), stepping the beat's tasks until nothing is left to do.

Then: every request line of the input is in exactly one of the output and error files,
once, under its own custom_id; the counts add up; every job reached a terminal status;
no job of an expired or cancelled batch started after the batch left expansion; every
background task stopped on its own with its attempts recorded and within its bound
(expansion and finalize attempts, webhook attempts, each webhook accepted at most once);
and the beat finds nothing more to do.

CI runs a few examples; ``make faults`` sets ``HYPOTHESIS_PROFILE=faults`` (60)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.api.conftest import ApiEnv, jsonl, tiny_worker
from tests.faults.line_strategies import batch_input, body, job_fields
from tests.jsonl import read_jsonl

pytestmark = pytest.mark.services

settings.register_profile("ci", max_examples=4)  # each example runs every scenario
settings.register_profile("faults", max_examples=60)
PROFILE = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

TENANT = "t-prop"
LINE_BYTES = 2048
MAX_ATTEMPTS = 3
SCENARIOS = ("plain", "crash", "expire", "cancel", "finalize_fails")
QUIET_DEADLINE_S = 180.0


@pytest.fixture
def stack(make_env: Callable[..., ApiEnv]) -> Iterator[tuple[ApiEnv, Any]]:
    """One API env and one in-process worker for every example of the test."""
    from benchmarks.soak_traffic import Receiver

    env = make_env(expand_chunk=2, max_batch_line_bytes=LINE_BYTES,
                   webhook_allow_hosts=("127.0.0.1",), webhook_max_attempts=MAX_ATTEMPTS,
                   webhook_backoff=0.05, webhook_total_timeout=3.0,
                   expand_max_attempts=MAX_ATTEMPTS, finalize_max_attempts=MAX_ATTEMPTS)
    receiver = Receiver()
    with tiny_worker(env, "prop"):
        yield env, receiver
    receiver.close()


def _dead_url() -> str:
    from benchmarks.soak import _free_port

    return f"http://127.0.0.1:{_free_port()}/hook/dead"


def _upload(env: ApiEnv, h: dict[str, str], lines: list[str]) -> str:
    r = env.client.post("/v1/files", data={"purpose": "batch"}, headers=h,
                        files={"file": ("in.jsonl", jsonl(lines), "application/jsonl")})
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def _create_batch(env: ApiEnv, h: dict[str, str], file_id: str, endpoint: str,
                  scenario: str, at_chunk: int) -> str:
    """The batch, created through the API and expanded as its scenario says."""
    from api.control import expand

    dispatcher = env.app.state.dispatcher
    held = scenario not in ("plain", "finalize_fails")
    # the expansion the create dispatches is held back then: the test runs it, hooked
    with mock.patch.object(dispatcher, "submit", lambda *_a: None) if held else \
            contextlib.nullcontext():
        r = env.client.post("/v1/batches", headers=h, json={
            "input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"})
    assert r.status_code == 200, r.text
    batch_id = str(r.json()["id"])
    if not held:
        return batch_id
    real = expand._commit_chunk
    chunks: list[int] = []
    expiry = _RacingExpiry(env, batch_id)

    def hooked(*a: Any, **kw: Any) -> bool:
        go_on = real(*a, **kw)
        chunks.append(1)
        if len(chunks) == at_chunk:
            if scenario == "crash":
                raise RuntimeError("the expanding process died")
            if scenario == "expire":
                expiry.start()
            if scenario == "cancel":
                assert env.client.post(f"/v1/batches/{batch_id}/cancel",
                                       headers=h).status_code in (200, 400)
        elif len(chunks) == at_chunk + 1:
            expiry.finish()
        return go_on

    try:
        with mock.patch.object(expand, "_commit_chunk", hooked), \
                contextlib.suppress(RuntimeError):
            expand.expand_batch(env.ctx, batch_id=batch_id)
    finally:
        expiry.finish()  # when no chunk came after the one it started at
    return batch_id


class _RacingExpiry:
    """The beat's expire_batches in a thread of its own, started after one chunk of the
    expansion and held just before it moves the batch, while the expansion commits its
    next chunk; then let go. Whatever the expiry does before its move races that chunk."""

    def __init__(self, env: ApiEnv, batch_id: str) -> None:
        self.env, self.batch_id = env, batch_id
        self.at_move, self.go = threading.Event(), threading.Event()
        self.thread: threading.Thread | None = None
        self.patch: Any = None

    def start(self) -> None:
        from api.control import maintenance

        real = maintenance.start_expiry

        def held(**kw: Any) -> bool:
            self.at_move.set()
            assert self.go.wait(60)
            return real(**kw)

        _past_window(self.env, self.batch_id)
        self.patch = mock.patch.object(maintenance, "start_expiry", held)
        self.patch.start()
        self.thread = threading.Thread(target=maintenance.expire_batches, args=(self.env.ctx,))
        self.thread.start()
        assert self.at_move.wait(60), "the expiry never reached its move"

    def finish(self) -> None:
        if self.thread is None:
            return
        self.go.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the expiry did not end"
        self.patch.stop()
        self.thread = None


def _past_window(env: ApiEnv, batch_id: str) -> None:
    from worker.store.base import utcnow
    from worker.store.crud.batches import get_batch

    with env.ctx.session_factory.begin() as s:
        get_batch(session=s, batch_id=batch_id).expires_at = utcnow() - timedelta(seconds=1)


def _beat_round(env: ApiEnv) -> dict[str, Any]:
    """The beat's batch and webhook tasks once each, as Celery runs them."""
    from api.control.celery_app import send

    celery = env.app.state.celery
    ran = {name: celery.tasks[name].apply().get() for name in (
        "inflight.resume_expansions", "inflight.finalize_ready_batches",
        "inflight.deliver_webhooks", "inflight.expire_batches")}
    for batch_id in ran["inflight.resume_expansions"]:
        send(celery, "inflight.expand_batch", batch_id)
    return ran


def _quiet(env: ApiEnv, batch_id: str, job_ids: list[str]) -> bool:
    from worker.store.crud.batches import get_batch
    from worker.store.models import ApiJob, Job

    with env.ctx.session_factory() as s:
        batch = get_batch(session=s, batch_id=batch_id)
        open_jobs = s.query(Job).filter(
            (Job.batch_id == batch_id) | Job.id.in_(job_ids),
            Job.status.in_(("queued", "running"))).count()
        pending = s.query(ApiJob).filter(ApiJob.job_id.in_(job_ids),
                                         ApiJob.webhook_state == "pending").count()
    return batch.status in ("completed", "failed", "expired", "cancelled") and not (
        open_jobs or pending)


def _lines_of(env: ApiEnv, h: dict[str, str], file_id: str | None) -> list[dict[str, Any]]:
    if not file_id:
        return []
    r = env.client.get(f"/v1/files/{file_id}/content", headers=h)
    assert r.status_code == 200, r.text
    return read_jsonl(r.text)


def _own_custom_id(raw: str) -> str | None:
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    return obj.get("custom_id") if isinstance(obj, dict) else None


def _check(env: ApiEnv, h: dict[str, str], batch_id: str, lines: list[str],
           job_ids: list[str], receiver: Any, scenario: str) -> None:
    from api.control.batch_ids import line_of_job
    from worker.store.crud.batch_admin import get_progress
    from worker.store.crud.batches import get_batch
    from worker.store.models import ApiJob, Job

    with env.ctx.session_factory() as s:
        batch = get_batch(session=s, batch_id=batch_id)
        progress = get_progress(session=s, batch_id=batch_id)
        jobs = s.query(Job).filter((Job.batch_id == batch_id) | Job.id.in_(job_ids)).all()
        hooks = s.query(ApiJob).filter(ApiJob.job_id.in_(job_ids)).all()
    # every job ended
    assert all(j.status in ("succeeded", "failed", "cancelled") for j in jobs), [
        (j.id, j.status) for j in jobs]
    # bounded and recorded: expansion, finalize, webhooks
    assert (progress.expand_attempts or 0) <= MAX_ATTEMPTS
    assert (progress.finalize_attempts or 0) <= MAX_ATTEMPTS + 1
    for hook in hooks:
        assert hook.webhook_state in ("none", "delivered", "failed"), hook.webhook_state
        assert hook.webhook_attempts <= MAX_ATTEMPTS
        if hook.webhook_state == "failed":
            assert hook.webhook_error
    assert all(n == 1 for n in receiver.accepted.values()), receiver.accepted
    if batch.status == "failed":  # no files: its errors say why
        assert batch.errors, "a failed batch without its reason"
        return
    # every request line in exactly one of the files, once, under its own custom_id
    out = _lines_of(env, h, batch.output_file_id)
    err = _lines_of(env, h, batch.error_file_id)
    seen = {}
    for entry in out + err:
        n = line_of_job(entry["response"]["request_id"])
        assert n not in seen, f"line {n} twice: {seen[n]} and {entry}"
        seen[n] = entry
    # a job that succeeded is in the output file, unless it was running when the batch
    # expired (its cancel recorded, its end racing the abort): a job left to run after
    # its batch ended (an orphan chunk) succeeds behind the files' back
    written = {entry["response"]["request_id"] for entry in out}
    orphans = [j.id for j in jobs if j.batch_id == batch_id and j.status == "succeeded"
               and j.id not in written and j.cancel_requested_at is None]
    assert not orphans, f"jobs of the {batch.status} batch ran after its files: {orphans}"
    want = [i for i, raw in enumerate(lines, start=1) if raw.strip()]
    assert sorted(seen) == want, (sorted(seen), want, batch.status)
    for n, entry in seen.items():
        own = _own_custom_id(lines[n - 1])
        if isinstance(own, str) and entry["custom_id"] is not None:
            assert entry["custom_id"] == own, (n, entry["custom_id"], own)
    assert batch.request_total == len(want)
    assert (batch.request_completed, batch.request_failed) == (len(out), len(err))
    event(f"{scenario}: batch {batch.status}, {'some' if out else 'no'} lines succeeded")
    event(f"{sum(j.status == 'succeeded' for j in jobs if j.batch_id is None)} of "
          f"{len(job_ids)} jobs succeeded")


@settings(PROFILE, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_every_line_ends_exactly_once_and_nothing_retries_forever(
    stack: tuple[ApiEnv, Any], data: st.DataObject
) -> None:
    env, receiver = stack
    h = env.auth(f"{TENANT}-{uuid.uuid4().hex[:8]}")  # a tenant per example: its own keys
    endpoint = data.draw(st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
    lines = data.draw(batch_input(endpoint=endpoint, max_line_bytes=LINE_BYTES), label="lines")
    at_chunk = data.draw(st.integers(1, 3), label="at_chunk")
    job_ids: list[str] = []
    fields = job_fields(env.app.openapi())
    for _ in range(data.draw(st.integers(0, 3))):
        chat = data.draw(st.booleans())
        request = {**data.draw(body(chat=chat, batch=False)), **data.draw(fields)}
        hook = data.draw(st.sampled_from(["none", "ok", "flaky", "dead"]))
        if hook != "none":
            request["callback_url"] = receiver.url(hook) if hook != "dead" else _dead_url()
        r = env.client.post("/v1/jobs", json=request, headers=h)
        assert r.status_code in (200, 201, 400, 429), r.text
        if r.status_code in (200, 201):
            job_ids.append(r.json()["id"])
    for scenario in SCENARIOS:  # the same input through each of them
        _run(env, h, receiver, lines, endpoint, scenario, at_chunk, job_ids)
        job_ids = []  # the jobs ran (and were checked) with the first scenario


def _run(env: ApiEnv, h: dict[str, str], receiver: Any, lines: list[str], endpoint: str,
         scenario: str, at_chunk: int, job_ids: list[str]) -> None:
    """One batch of ``lines`` through ``scenario``, stepped until quiet, then checked."""
    from api.control import finalize

    with contextlib.ExitStack() as patches:
        if scenario == "finalize_fails":
            real = finalize._write_files
            failed: list[int] = []

            def once(*a: Any, **kw: Any) -> Any:
                if not failed:
                    failed.append(1)
                    raise OSError("disk full, once")
                return real(*a, **kw)

            patches.enter_context(mock.patch.object(finalize, "_write_files", once))
        batch_id = _create_batch(env, h, _upload(env, h, lines), endpoint, scenario, at_chunk)
        deadline = time.monotonic() + QUIET_DEADLINE_S
        while not _quiet(env, batch_id, job_ids):
            assert env.app.state.dispatcher.wait_idle(60)
            _beat_round(env)
            assert time.monotonic() < deadline, f"{scenario}: not quiet after {QUIET_DEADLINE_S:.0f} s"
            time.sleep(0.1)
    assert env.app.state.dispatcher.wait_idle(60)
    _check(env, h, batch_id, lines, job_ids, receiver, scenario)
    # the beat has nothing left to do for them
    before = _attempts(env, batch_id, job_ids)
    after = _beat_round(env)
    assert batch_id not in after["inflight.resume_expansions"]
    assert _attempts(env, batch_id, job_ids) == before


def _attempts(env: ApiEnv, batch_id: str, job_ids: list[str]) -> tuple[Any, ...]:
    """Every attempt count of the example's batch and webhooks, and the batch's status."""
    from worker.store.crud.batch_admin import get_progress
    from worker.store.crud.batches import get_batch
    from worker.store.models import ApiJob

    with env.ctx.session_factory() as s:
        p = get_progress(session=s, batch_id=batch_id)
        hooks = sorted((a.job_id, a.webhook_attempts, a.webhook_state)
                       for a in s.query(ApiJob).filter(ApiJob.job_id.in_(job_ids)))
        status = get_batch(session=s, batch_id=batch_id).status
    return status, p.expand_attempts, p.finalize_attempts, tuple(hooks)
