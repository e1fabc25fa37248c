"""The producer client's retries (no services needed): the same idempotency key is sent on
every attempt of a submit, 5xx and connection errors are retried, 4xx are not."""

from __future__ import annotations

import httpx
import pytest

from api.client import ApiError, Client


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
    with pytest.raises(ApiError) as info:
        c.get("job_x")
    assert info.value.status == 404 and info.value.error["code"] == "not_found" and calls == 1


def test_gives_up_after_retries() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"error": {"message": "down"}})

    c = Client(
        "http://x", api_key="k", retries=2, backoff=0.001, transport=httpx.MockTransport(handler)
    )
    with pytest.raises(ApiError) as info:
        c.cancel("job_x")
    assert info.value.status == 500
