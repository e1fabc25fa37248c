"""Batch events, end to end through the API against the real PostgreSQL and Redis: a batch
created with a ``callback_url`` gets OpenAI's event (``batch.completed``, ``.failed``,
``.expired``, ``.cancelled``) POSTed once it ends, signed with the tenant's secret (our
``X-Inflight-Signature`` and the Standard Webhooks headers OpenAI's SDK verifies), through
the job webhooks' delivery: checked destination, retried with backoff, leased, once."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from tests.api.conftest import ApiEnv, batch_lines, jsonl, wait_expanded
from worker.store.schemas import JobResult

pytestmark = pytest.mark.services


class _Hook(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[dict[str, str], bytes]]] = []
    status: ClassVar[int] = 204

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((dict(self.headers), body))
        self.send_response(type(self).status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hook(api_db_url: str):
    """A loopback receiver (reached through the operator allow-list); afterwards no batch
    event is left pending in the shared database."""
    from sqlalchemy import update

    from worker.store.db import make_engine
    from worker.store.models import Batch

    _Hook.received, _Hook.status = [], 204
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/events"
    server.shutdown()
    engine = make_engine(url=api_db_url)
    with engine.begin() as conn:
        conn.execute(update(Batch).where(Batch.webhook_state.in_(("pending", "waiting")))
                     .values(webhook_state="none"))
    engine.dispose()


def _batch(env: ApiEnv, h: dict[str, str], data: bytes, **kw: Any) -> dict[str, Any]:
    fid = env.client.post("/v1/files", headers=h, data={"purpose": "batch"},
                          files={"file": ("in.jsonl", data)}).json()["id"]
    r = env.client.post("/v1/batches", headers=h, json={
        "input_file_id": fid, "endpoint": "/v1/completions", **kw})
    assert r.status_code == 200, r.text
    return wait_expanded(env, h, r.json()["id"])


def _finish_all(env: ApiEnv, batch_id: str) -> None:
    from worker.store.crud.job_status import finish_jobs
    from worker.store.crud.jobs import list_jobs

    with env.ctx.session_factory.begin() as s:
        jobs = list_jobs(session=s, batch_id=batch_id, limit=1000)
        finish_jobs(session=s, worker_id="fake", results=[
            JobResult(job_id=j.id, status="succeeded", text="ok", finish_reason="stop",
                      prompt_tokens=3, completion_tokens=2) for j in jobs])


def _events(env: ApiEnv) -> list[tuple[dict[str, str], dict[str, Any]]]:
    from api.control.webhooks import deliver_due_webhooks

    deliver_due_webhooks(env.ctx)
    return [(headers, json.loads(body)) for headers, body in _Hook.received]


def test_a_completed_batch_sends_one_signed_openai_event(make_env, hook: str) -> None:
    import hashlib
    import hmac

    from openai import OpenAI
    from openai.types.webhooks import BatchCompletedWebhookEvent

    env = make_env(webhook_allow_hosts=("127.0.0.1",))
    h = env.auth("t-events")
    secret = env.client.get("/v1/webhook_secret", headers=h).json()["secret"]
    batch = _batch(env, h, jsonl(batch_lines(3)), callback_url=hook)
    assert batch["callback_url"] == hook and batch["webhook"]["state"] == "waiting"
    assert _events(env) == []  # nothing while it runs
    _finish_all(env, batch["id"])
    done = env.client.get(f"/v1/batches/{batch['id']}", headers=h).json()
    assert done["status"] == "completed"
    [(headers, event)] = _events(env)
    assert event == {"id": "evt_" + batch["id"].removeprefix("batch_"), "object": "event",
                     "type": "batch.completed", "created_at": done["completed_at"],
                     "data": {"id": batch["id"]}}
    raw = _Hook.received[0][1]
    # OpenAI's SDK verifies the Standard Webhooks signature and parses the event
    parsed = OpenAI(api_key="unused", webhook_secret=secret).webhooks.unwrap(raw, headers)
    assert isinstance(parsed, BatchCompletedWebhookEvent) and parsed.data.id == batch["id"]
    ts = headers["X-Inflight-Timestamp"]
    mac = hmac.new(secret.encode(), f"{ts}.".encode() + raw, hashlib.sha256).hexdigest()
    assert headers["X-Inflight-Signature"] == f"v1={mac}"
    assert headers["X-Inflight-Event"] == "batch.completed"
    assert headers["webhook-id"] == event["id"]
    view = env.client.get(f"/v1/batches/{batch['id']}", headers=h).json()
    assert view["webhook"] == {"state": "delivered", "attempts": 1, "last_error": None}
    assert len(_events(env)) == 1  # once


def test_failed_cancelled_and_expired_batches_send_their_events(make_env, hook: str) -> None:
    from api.control.maintenance import expire_batches
    from worker.store.base import utcnow
    from worker.store.crud.batches import get_batch

    env = make_env(webhook_allow_hosts=("127.0.0.1",))
    h = env.auth("t-events-2")
    failed = _batch(env, h, b"\n\n", callback_url=hook)  # no request at all
    assert failed["status"] == "failed"
    cancelled = _batch(env, h, jsonl(batch_lines(2)), callback_url=hook)
    assert env.client.post(f"/v1/batches/{cancelled['id']}/cancel", headers=h).json()[
        "status"] in ("cancelling", "cancelled")
    expired = _batch(env, h, jsonl(batch_lines(2)), callback_url=hook, completion_window="1h")
    with env.ctx.session_factory.begin() as s:
        get_batch(session=s, batch_id=expired["id"]).expires_at = utcnow() - timedelta(seconds=1)
    assert expired["id"] in expire_batches(env.ctx)
    quiet = _batch(env, h, jsonl(batch_lines(1)))  # no callback_url: no event
    assert quiet["webhook"] is None
    got = {e["data"]["id"]: e["type"] for _, e in _events(env)}
    assert got == {failed["id"]: "batch.failed", cancelled["id"]: "batch.cancelled",
                   expired["id"]: "batch.expired"}
    for b in (failed, cancelled, expired):
        view = env.client.get(f"/v1/batches/{b['id']}", headers=h).json()
        assert view["webhook"]["state"] == "delivered"


def test_a_failed_delivery_is_retried_and_a_private_destination_refused(make_env,
                                                                         hook: str) -> None:
    env = make_env(webhook_allow_hosts=("127.0.0.1",), webhook_backoff=0.0)
    h = env.auth("t-events-3")
    batch = _batch(env, h, jsonl(batch_lines(1)), callback_url=hook)
    _finish_all(env, batch["id"])
    env.client.get(f"/v1/batches/{batch['id']}", headers=h)
    _Hook.status = 503
    assert len(_events(env)) == 1
    view = env.client.get(f"/v1/batches/{batch['id']}", headers=h).json()
    assert view["webhook"] == {"state": "pending", "attempts": 1, "last_error": "HTTP 5xx"}
    _Hook.status = 204
    events = _events(env)
    assert len(events) == 2 and events[0][0]["webhook-id"] == events[1][0]["webhook-id"]
    assert events[1][0]["X-Inflight-Delivery-Attempt"] == "2"
    view = env.client.get(f"/v1/batches/{batch['id']}", headers=h).json()
    assert view["webhook"]["state"] == "delivered"
    # a destination inside the network is refused at creation, and nothing is created
    strict = make_env()
    h2 = strict.auth("t-events-4")
    fid = strict.client.post("/v1/files", headers=h2, data={"purpose": "batch"},
                             files={"file": ("in.jsonl", jsonl(batch_lines(1)))}).json()["id"]
    r = strict.client.post("/v1/batches", headers=h2, json={
        "input_file_id": fid, "endpoint": "/v1/completions", "callback_url": hook})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_callback_url"
    assert strict.client.get("/v1/batches", headers=h2).json()["data"] == []
