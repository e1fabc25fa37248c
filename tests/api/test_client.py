"""The producer client's retries (no services needed): the same idempotency key is sent on
every attempt of a submit, 5xx and connection errors are retried, 4xx are not."""

from __future__ import annotations

import httpx
import pytest

from api.client import Client, ClientError


def test_submit_retries_with_one_idempotency_key() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["Idempotency-Key"])
        if len(seen) == 1:
            raise httpx.ConnectError("boom", request=request)
        if len(seen) == 2:
            return httpx.Response(503, json={"error": {"message": "busy"}})
        return httpx.Response(201, json={"id": "job_1", "status": "queued"})

    c = Client("http://x", api_key="k", backoff=0.001, transport=httpx.MockTransport(handler))
    assert c.submit({"prompt": "hi"})["id"] == "job_1"
    assert len(seen) == 3 and len(set(seen)) == 1


def test_client_errors_are_not_retried() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        assert request.headers["Authorization"] == "Bearer k"
        return httpx.Response(404, json={"error": {"message": "No job", "code": "not_found"}})

    c = Client("http://x", api_key="k", backoff=0.001, transport=httpx.MockTransport(handler))
    with pytest.raises(ClientError) as info:
        c.get("job_x")
    assert info.value.status == 404 and info.value.error["code"] == "not_found" and calls == 1


def test_gives_up_after_retries() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"error": {"message": "down"}})

    c = Client(
        "http://x", api_key="k", retries=2, backoff=0.001, transport=httpx.MockTransport(handler)
    )
    with pytest.raises(ClientError) as info:
        c.cancel("job_x")
    assert info.value.status == 500


def test_non_idempotent_posts_are_not_replayed_once_sent(tmp_path) -> None:
    """POST /v1/batches (no idempotency key) is retried only on errors raised before the
    request was sent; a timeout or 5xx after it may have been committed is raised, so no
    second batch is created. GETs and keyed submits are still retried on both."""
    calls: dict[str, int] = {}
    plan: dict[str, list] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        key = f"{request.method} {request.url.path}"
        calls[key] = calls.get(key, 0) + 1
        step = plan[key].pop(0)
        if isinstance(step, type) and issubclass(step, Exception):
            raise step("boom", request=request)
        return httpx.Response(step, json={"id": "x_1", "status": "queued"})

    c = Client("http://x", api_key="k", backoff=0.001, transport=httpx.MockTransport(handler))

    plan["POST /v1/batches"] = [httpx.ReadTimeout, 200]
    with pytest.raises(httpx.ReadTimeout):
        c._request("POST", "/v1/batches", json={"input_file_id": "f"})
    assert calls["POST /v1/batches"] == 1

    plan["POST /v1/batches"] = [503, 200]
    with pytest.raises(ClientError) as info:
        c._request("POST", "/v1/batches", json={"input_file_id": "f"})
    assert info.value.status == 503 and calls["POST /v1/batches"] == 2

    plan["POST /v1/batches"] = [httpx.ConnectError, httpx.ConnectTimeout, 429, 200]
    assert c._request("POST", "/v1/batches", json={"input_file_id": "f"}).status_code == 200
    assert calls["POST /v1/batches"] == 6

    path = tmp_path / "in.jsonl"
    path.write_text('{"prompt": "p"}\n')
    plan["POST /v1/files"] = [httpx.ReadTimeout, 200]
    with pytest.raises(httpx.ReadTimeout):
        c.upload(path)
    assert calls["POST /v1/files"] == 1

    plan["GET /v1/batches/b"] = [httpx.ReadTimeout, 502, 200]
    assert c.get_batch("b")["id"] == "x_1" and calls["GET /v1/batches/b"] == 3

    plan["POST /v1/jobs"] = [httpx.ReadTimeout, 500, 201]
    assert c.submit({"prompt": "hi"})["id"] == "x_1" and calls["POST /v1/jobs"] == 3


def test_submit_batch_retries_its_creation_with_one_idempotency_key(tmp_path) -> None:
    """The batch creation carries an Idempotency-Key, so a timeout or a 5xx after the
    server may have committed is retried with the same key (the server answers the batch
    already created); the upload before it is not replayed once sent."""
    keys: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/files":
            return httpx.Response(200, json={"id": "file_1"})
        keys.append(request.headers["Idempotency-Key"])
        if len(keys) == 1:
            raise httpx.ReadTimeout("boom", request=request)
        if len(keys) == 2:
            return httpx.Response(502, json={"error": {"message": "bad gateway"}})
        return httpx.Response(200, json={"id": "batch_1", "status": "validating"})

    path = tmp_path / "in.jsonl"
    path.write_text('{"prompt": "p"}\n')
    c = Client("http://x", api_key="k", backoff=0.001, transport=httpx.MockTransport(handler))
    assert c.submit_batch(path)["id"] == "batch_1"
    assert len(keys) == 3 and len(set(keys)) == 1
    keys.clear()
    c.submit_batch(path, idempotency_key="nightly-2026-12-01")
    assert keys[-1] == "nightly-2026-12-01"


def test_submit_sends_a_deadline_as_rfc3339_or_unix_seconds() -> None:
    import json
    from datetime import datetime, timezone

    sent: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(201, json={"id": "job_1", "status": "queued"})

    c = Client("http://x", api_key="k", transport=httpx.MockTransport(handler))
    due = datetime(2027, 1, 1, 12, tzinfo=timezone.utc)
    c.submit({"prompt": "hi"}, queue_class="batch", deadline=due)
    c.submit({"prompt": "hi"}, queue_class="batch", deadline=1_800_000_000)
    c.submit({"prompt": "hi"})
    assert [s.get("deadline") for s in sent] == ["2027-01-01T12:00:00+00:00", 1_800_000_000, None]
