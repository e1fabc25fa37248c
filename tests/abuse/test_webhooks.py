"""Webhooks cannot be aimed inside the network, are signed, claimed once, cut at a total
deadline, and never tell the tenant what the receiver said. Every receiver here listens
on 127.0.0.1 and is reached through the operator allow-list; no other address is ever
connected to."""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from tests.api.conftest import ApiEnv
from worker.store.schemas import JobResult

pytestmark = pytest.mark.services

JOB = {"prompt": "hi", "max_tokens": 2}


class _Receiver(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[dict[str, str], bytes]]] = []
    mode: ClassVar[str] = "ok"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((dict(self.headers), body))
        if type(self).mode == "drip":  # headers one byte at a time, forever
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            try:
                for _ in range(100):
                    self.wfile.write(b"X")
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:  # the sender hung up, as it should
                pass
            return
        status = 500 if type(self).mode == "error" else 204
        secret = b"internal-token=hunter2 at 10.0.0.7"
        self.send_response(status)
        self.send_header("Content-Length", str(len(secret)))
        self.end_headers()
        self.wfile.write(secret)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver(api_db_url: str):
    """A loopback receiver; afterwards no webhook is left pending in the shared database
    (other tests count deliveries)."""
    from sqlalchemy import update

    from worker.store.db import make_engine
    from worker.store.models import ApiJob

    _Receiver.received = []
    _Receiver.mode = "ok"
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook"
    server.shutdown()
    engine = make_engine(url=api_db_url)
    with engine.begin() as conn:
        conn.execute(
            update(ApiJob).where(ApiJob.webhook_state == "pending").values(webhook_state="none")
        )
    engine.dispose()


def _ended_job(env: ApiEnv, h: dict[str, str], url: str) -> str:
    from worker.store.crud.job_status import finish_jobs

    resp = env.client.post("/v1/jobs", json={**JOB, "callback_url": url}, headers=h)
    assert resp.status_code == 201, resp.text
    job_id = resp.json()["id"]
    with env.ctx.session_factory.begin() as s:
        finish_jobs(session=s, results=[JobResult(job_id=job_id, status="succeeded", text="ok",
                                                  finish_reason="stop", prompt_tokens=1,
                                                  completion_tokens=1)])
    return job_id


def _webhook(env: ApiEnv, h: dict[str, str], job_id: str) -> dict[str, Any]:
    return env.client.get(f"/v1/jobs/{job_id}", headers=h).json()["webhook"]


def test_delivery_is_signed_and_verifiable(make_env, receiver: str) -> None:
    from api.control.webhooks import deliver_due_webhooks

    env = make_env(webhook_allow_hosts=("127.0.0.1",))
    h = env.auth("tenant-wh")
    secret = env.client.get("/v1/webhook_secret", headers=h).json()["secret"]
    job_id = _ended_job(env, h, receiver)
    assert deliver_due_webhooks(env.ctx)["delivered"] == 1
    headers, body = _Receiver.received[0]
    ts = headers["X-Inflight-Timestamp"]
    expected = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(headers["X-Inflight-Signature"], f"v1={expected}")
    assert abs(int(ts) - time.time()) < 60
    assert _webhook(env, h, job_id)["state"] == "delivered"
    rotated = env.client.post("/v1/webhook_secret/rotate", headers=h).json()["secret"]
    assert rotated != secret
    assert env.client.get("/v1/webhook_secret", headers=h).json()["secret"] == rotated
    other = env.client.get("/v1/webhook_secret", headers=env.auth("tenant-other")).json()
    assert other["secret"] not in (secret, rotated)


def test_receiver_answer_is_reduced_to_a_status_class(make_env, receiver: str) -> None:
    from api.control.webhooks import deliver_due_webhooks

    env = make_env(webhook_allow_hosts=("127.0.0.1",), webhook_backoff=0.0)
    h = env.auth("tenant-wh2")
    _Receiver.mode = "error"
    job_id = _ended_job(env, h, receiver)
    assert deliver_due_webhooks(env.ctx)["retrying"] == 1
    assert _webhook(env, h, job_id)["last_error"] == "HTTP 5xx"
    _Receiver.mode = "ok"
    closed = _ended_job(env, h, "http://127.0.0.1:1/x")
    deliver_due_webhooks(env.ctx)
    assert _webhook(env, h, closed)["last_error"] == "connection failed"


def test_slow_receiver_is_cut_at_the_total_deadline(make_env, receiver: str) -> None:
    from api.control.webhooks import deliver_due_webhooks

    env = make_env(webhook_allow_hosts=("127.0.0.1",), webhook_total_timeout=1.0,
                   webhook_timeout=5.0)
    h = env.auth("tenant-wh3")
    _Receiver.mode = "drip"
    job_id = _ended_job(env, h, receiver)
    start = time.monotonic()
    assert deliver_due_webhooks(env.ctx)["retrying"] == 1
    assert time.monotonic() - start < 4.0
    assert _webhook(env, h, job_id)["last_error"] == "timeout"


def test_destination_is_checked_again_at_delivery(make_env, receiver: str) -> None:
    from api.control.webhooks import deliver_due_webhooks

    env = make_env(webhook_allow_hosts=("127.0.0.1",))
    h = env.auth("tenant-wh4")
    job_id = _ended_job(env, h, receiver)
    env.ctx.settings.webhook_allow_hosts = ()  # the operator removed it meanwhile
    assert deliver_due_webhooks(env.ctx)["failed"] == 1
    assert _Receiver.received == []
    hook = _webhook(env, h, job_id)
    assert hook["state"] == "failed" and hook["last_error"].startswith("refused: ")


def test_resolution_decides_not_the_name() -> None:
    from api.control.destinations import DestinationRefused, resolve

    def rebinding(host: str, port: int, **_: Any) -> list[Any]:  # a public-looking name
        return [(2, 1, 6, "", ("10.0.0.5", port))]

    with pytest.raises(DestinationRefused, match="private"):
        resolve("https://hooks.example.com/x", allow_hosts=(), lookup=rebinding)

    def public(host: str, port: int, **_: Any) -> list[Any]:
        return [(2, 1, 6, "", ("93.184.216.34", port))]

    dest = resolve("https://hooks.example.com:8443/x", allow_hosts=(), lookup=public)
    assert (dest.address, dest.host, dest.port) == ("93.184.216.34", "hooks.example.com", 8443)


def test_due_deliveries_are_claimed_once(make_env, receiver: str) -> None:
    from datetime import timedelta

    from worker.store.crud.api_jobs import claim_due_webhooks, webhook_lease

    env = make_env(webhook_allow_hosts=("127.0.0.1",))
    h = env.auth("tenant-wh5")
    ids = {_ended_job(env, h, receiver) for _ in range(3)}
    first = env.ctx.session_factory()
    second = env.ctx.session_factory()
    try:
        with first.begin():
            lease = webhook_lease(timedelta(seconds=60))
            got_first = set(claim_due_webhooks(session=first, lease=lease))
            with second.begin():  # overlapping beat, while the first holds its locks
                other = webhook_lease(timedelta(seconds=60))
                got_second = set(claim_due_webhooks(session=second, lease=other))
        with second.begin():  # and after the first committed its lease
            got_late = set(claim_due_webhooks(session=second, lease=other))
    finally:
        first.close()
        second.close()
    assert ids <= got_first
    assert not (got_first & got_second) and not (got_first & got_late)


def _store_callback(env: ApiEnv, job_id: str, url: str) -> None:
    """Put ``url`` in the job's row as a submission before the parser fix could have."""
    from sqlalchemy import update

    from worker.store.models import ApiJob

    with env.ctx.session_factory.begin() as s:
        s.execute(update(ApiJob).where(ApiJob.job_id == job_id).values(callback_url=url))


def test_submission_refuses_what_delivery_cannot_parse(make_env, receiver: str) -> None:
    """A control character passed the old parser (urlsplit) and made every delivery raise;
    it is refused at submission now, as is a host IDNA 2008 (httpx) refuses."""
    from api.control.destinations import DestinationRefused, resolve

    env = make_env(webhook_allow_hosts=("127.0.0.1",))
    h = env.auth("tenant-wh6")
    for url in (receiver + "\x01", receiver.replace("/hook", "/a\x7fb")):
        resp = env.client.post("/v1/jobs", json={**JOB, "callback_url": url}, headers=h)
        assert resp.status_code == 400, (url, resp.text)
        assert resp.json()["error"]["code"] == "invalid_callback_url"

    def public(host: str, port: int, **_: Any) -> list[Any]:
        return [(2, 1, 6, "", ("93.184.216.34", port))]

    for url in ("https://\u2603.net/x", "https://a\u200db.com/x"):
        with pytest.raises(DestinationRefused, match="not a valid URL"):
            resolve(url, allow_hosts=(), lookup=public)
    dest = resolve("https://fa\u00df.de/x", allow_hosts=(), lookup=public)  # IDNA 2008: kept
    assert dest.host == "xn--fa-hia.de"


def test_a_delivery_that_raises_fails_alone(make_env, receiver: str, monkeypatch) -> None:
    """A stored URL the delivery cannot parse, and a row whose delivery raises, are each
    recorded as a failed attempt; the delivery claimed after them is still sent."""
    from api.control import webhooks

    env = make_env(webhook_allow_hosts=("127.0.0.1",), webhook_backoff=0.0)
    h = env.auth("tenant-wh7")
    bad_url = _ended_job(env, h, receiver)
    _store_callback(env, bad_url, receiver + "\x01")
    crashing = _ended_job(env, h, receiver)
    good = _ended_job(env, h, receiver)
    real_view = webhooks.job_view

    def view(job: Any, **kw: Any) -> Any:
        if job.id == crashing:
            raise RuntimeError("boom")
        return real_view(job, **kw)

    monkeypatch.setattr(webhooks, "job_view", view)
    stats = webhooks.deliver_due_webhooks(env.ctx)
    assert stats["delivered"] >= 1
    assert _webhook(env, h, good)["state"] == "delivered"
    hook = _webhook(env, h, bad_url)
    assert hook["state"] == "failed" and hook["last_error"].startswith("refused: ")
    hook = _webhook(env, h, crashing)
    assert hook == {"state": "pending", "attempts": 1, "last_error": "delivery error"}
    assert len(_Receiver.received) == 1


def test_a_late_claimer_cannot_record_over_the_lease_holder(make_env, receiver: str) -> None:
    """Once a lease ran out and another claimer took the delivery, the first claimer's
    write is refused: the row is the new holder's."""
    from datetime import timedelta

    from sqlalchemy import update

    from worker.store.base import utcnow
    from worker.store.crud.api_jobs import (
        claim_due_webhooks,
        record_webhook_attempt,
        webhook_lease,
    )
    from worker.store.models import ApiJob

    env = make_env(webhook_allow_hosts=("127.0.0.1",))
    h = env.auth("tenant-wh8")
    job_id = _ended_job(env, h, receiver)
    first, second = webhook_lease(timedelta(seconds=60)), webhook_lease(timedelta(seconds=60))
    assert first.holder != second.holder
    with env.ctx.session_factory.begin() as s:
        assert job_id in claim_due_webhooks(session=s, lease=first)
    with env.ctx.session_factory.begin() as s:  # the first stalled past its lease
        s.execute(update(ApiJob).where(ApiJob.job_id == job_id)
                  .values(webhook_next_at=utcnow() - timedelta(seconds=1)))
    with env.ctx.session_factory.begin() as s:
        assert job_id in claim_due_webhooks(session=s, lease=second)
    with env.ctx.session_factory.begin() as s:
        assert not record_webhook_attempt(session=s, lease=first, job_id=job_id,
                                          delivered=True)
        assert first.renew(s, [job_id]) == set()
    hook = _webhook(env, h, job_id)
    assert hook == {"state": "pending", "attempts": 0, "last_error": None}
    with env.ctx.session_factory.begin() as s:
        assert record_webhook_attempt(session=s, lease=second, job_id=job_id, delivered=True)
    assert _webhook(env, h, job_id)["state"] == "delivered"


def test_a_long_delivery_run_renews_its_leases(make_env, receiver: str, monkeypatch) -> None:
    """A run longer than one lease keeps what it claimed: a beat that starts meanwhile
    claims none of it, and each delivery is sent once."""
    from datetime import timedelta

    from api.control import webhooks
    from worker.store.crud.api_jobs import claim_due_webhooks, webhook_lease

    env = make_env(webhook_allow_hosts=("127.0.0.1",), webhook_total_timeout=1.0)
    monkeypatch.setattr(webhooks, "LEASE_MARGIN_S", 0.0)  # each lease lasts 1 s
    h = env.auth("tenant-wh9")
    ids = {_ended_job(env, h, receiver) for _ in range(6)}
    stolen: set[str] = set()
    sent: list[str] = []

    def slow_post(dest: Any, body: bytes, headers: dict[str, str], *_: Any) -> None:
        sent.append(headers["X-Inflight-Job-Id"])
        time.sleep(0.25)
        with env.ctx.session_factory.begin() as s:  # an overlapping beat
            stolen.update(claim_due_webhooks(session=s, lease=webhook_lease(timedelta(seconds=60))))
        return None

    monkeypatch.setattr(webhooks, "_post", slow_post)
    start = time.monotonic()
    stats = webhooks.deliver_due_webhooks(env.ctx)
    assert time.monotonic() - start > 1.2  # longer than one lease
    assert not (stolen & ids)
    assert ids <= set(sent) and len(sent) == len(set(sent))
    assert stats["delivered"] >= 6
    assert all(_webhook(env, h, j)["state"] == "delivered" for j in ids)
