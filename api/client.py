"""A producer client for the inflight API (httpx, synchronous).

    from api.client import Client
    c = Client("http://127.0.0.1:8000", api_key="ifk_...")
    job = c.submit({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16})
    done = c.wait(job["id"])
    batch = c.submit_batch("requests.jsonl")
    lines = c.download(c.wait_batch(batch["id"]))

Requests are retried with exponential backoff on connection errors, 429 and, where a
repeat is harmless, on timeouts and 5xx: GETs, DELETEs and ``submit`` (which sends an
idempotency key, generated when not given, so a retried submit never creates a second job).
Other POSTs (upload, batch creation, batch cancel) are retried only when the request cannot
have reached the server (connect errors) or on 429, never after a timeout or 5xx, so a
batch is never created twice.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

TERMINAL_JOB = ("succeeded", "failed", "cancelled")
TERMINAL_BATCH = ("completed", "failed", "expired", "cancelled")

_IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
# Raised before the request left this process: always safe to retry.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


class ClientError(Exception):
    """A non-retryable error answer: ``status`` and the OpenAI error object."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        super().__init__(f"HTTP {status}: {error.get('message')}")
        self.status = status
        self.error = error


class Client:
    """Talks to one API base URL with one API key."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str,
        timeout: float = 30.0,
        retries: int = 5,
        backoff: float = 0.25,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.retries = retries
        self.backoff = backoff
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            timeout=timeout,
            headers={"Authorization": f"Bearer {api_key}"},
            transport=transport,
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        # A request that may have reached the server is retried only when repeating it is
        # harmless: idempotent methods, and POSTs carrying an Idempotency-Key (submit,
        # submit_batch). Other POSTs (files, batch cancel, retry) are retried only on errors raised
        # before anything was sent, and on 429; a timeout or 5xx after the server committed
        # would otherwise create a second batch or file.
        headers = kwargs.get("headers") or {}
        replayable = method.upper() in _IDEMPOTENT_METHODS or any(
            name.lower() == "idempotency-key" for name in headers
        )
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                resp = self._http.request(method, path, **kwargs)
            except _NOT_SENT:
                if attempt == self.retries:
                    raise
            except (httpx.TransportError, httpx.TimeoutException):
                if attempt == self.retries or not replayable:
                    raise
            else:
                if resp.status_code < 400:
                    return resp
                retryable = resp.status_code == 429 or (resp.status_code >= 500 and replayable)
                if not retryable or attempt == self.retries:
                    try:
                        error = resp.json().get("error") or {}
                    except ValueError:
                        error = {"message": resp.text}
                    raise ClientError(resp.status_code, error)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
        raise AssertionError("unreachable")

    def submit(
        self,
        body: dict[str, Any],
        *,
        endpoint: str | None = None,
        priority: int = 0,
        custom_id: str | None = None,
        idempotency_key: str | None = None,
        callback_url: str | None = None,
        queue_class: str = "interactive",
        deadline: datetime | float | None = None,
    ) -> dict[str, Any]:
        """Submit one OpenAI chat/completions body as a job; returns the job object.
        ``deadline`` (batch work: an aware datetime or Unix seconds) is when it is due."""
        payload: dict[str, Any] = {**body, "priority": priority, "queue_class": queue_class}
        if deadline is not None:
            payload["deadline"] = (deadline.isoformat() if isinstance(deadline, datetime)
                                   else deadline)
        for name, value in (
            ("endpoint", endpoint),
            ("custom_id", custom_id),
            ("callback_url", callback_url),
        ):
            if value is not None:
                payload[name] = value
        key = idempotency_key or uuid.uuid4().hex
        return self._request(
            "POST", "/v1/jobs", json=payload, headers={"Idempotency-Key": key}
        ).json()

    def get(self, job_id: str) -> dict[str, Any]:
        """The job object."""
        return self._request("GET", f"/v1/jobs/{job_id}").json()

    def list_jobs(
        self,
        *,
        status: str | None = None,
        batch_id: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> dict[str, Any]:
        """A page of jobs in queue order; the next page is ``after=page["last_id"]`` while
        ``page["has_more"]``."""
        params = {
            k: v
            for k, v in (
                ("status", status),
                ("batch_id", batch_id),
                ("limit", limit),
                ("after", after),
            )
            if v is not None
        }
        return self._request("GET", "/v1/jobs", params=params).json()

    def wait(self, job_id: str, *, timeout: float = 600.0, poll: float = 0.25) -> dict[str, Any]:
        """Poll until the job ends; returns it. Raises TimeoutError."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if job["status"] in TERMINAL_JOB:
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job['status']} after {timeout}s")
            time.sleep(poll)

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a job (a running one is aborted by its worker); returns it."""
        return self._request("DELETE", f"/v1/jobs/{job_id}").json()

    def upload(self, path: str | Path, *, purpose: str = "batch") -> dict[str, Any]:
        """Upload a file; returns the file object."""
        path = Path(path)
        with open(path, "rb") as f:
            return self._request(
                "POST",
                "/v1/files",
                data={"purpose": purpose},
                files={"file": (path.name, f, "application/jsonl")},
            ).json()

    def submit_batch(
        self,
        path: str | Path,
        *,
        endpoint: str = "/v1/chat/completions",
        completion_window: str = "24h",
        metadata: dict[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Upload a JSONL file and create a batch from it; returns the batch object. The
        creation carries an Idempotency-Key (``idempotency_key``, else a fresh one), so a
        retry after a timeout or a 5xx answers the batch already created, never a second."""
        f = self.upload(path)
        body: dict[str, Any] = {
            "input_file_id": f["id"],
            "endpoint": endpoint,
            "completion_window": completion_window,
        }
        if metadata:
            body["metadata"] = metadata
        key = idempotency_key or uuid.uuid4().hex
        return self._request(
            "POST", "/v1/batches", json=body, headers={"Idempotency-Key": key}
        ).json()

    def delete_file(self, file_id: str) -> dict[str, Any]:
        """Delete a file and its bytes (409 while an unfinished batch reads it). Retried
        like any DELETE: a retry after a delete that went through answers 404."""
        return self._request("DELETE", f"/v1/files/{file_id}").json()

    def retry_batch(self, batch_id: str, **overrides: Any) -> dict[str, Any]:
        """A new batch of a finished batch's failed, cancelled and expired lines (same
        custom_ids); ``overrides``: ``completion_window``, ``metadata``,
        ``output_expires_after``. Returns the new batch."""
        return self._request("POST", f"/v1/batches/{batch_id}/retry", json=overrides).json()

    def get_batch(self, batch_id: str) -> dict[str, Any]:
        """The batch object."""
        return self._request("GET", f"/v1/batches/{batch_id}").json()

    def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        """Cancel a batch; returns it."""
        return self._request("POST", f"/v1/batches/{batch_id}/cancel").json()

    def wait_batch(
        self, batch_id: str, *, timeout: float = 3600.0, poll: float = 1.0
    ) -> dict[str, Any]:
        """Poll until the batch reaches a final status; returns it."""
        deadline = time.monotonic() + timeout
        while True:
            batch = self.get_batch(batch_id)
            if batch["status"] in TERMINAL_BATCH:
                return batch
            if time.monotonic() > deadline:
                raise TimeoutError(f"batch {batch_id} still {batch['status']} after {timeout}s")
            time.sleep(poll)

    def file_content(self, file_id: str) -> bytes:
        """A file's bytes."""
        return self._request("GET", f"/v1/files/{file_id}/content").content

    def download(
        self, batch: dict[str, Any] | str, *, errors: bool = False
    ) -> list[dict[str, Any]]:
        """The output lines (or with ``errors``, the error lines) of a finished batch."""
        if isinstance(batch, str):
            batch = self.get_batch(batch)
        file_id = batch.get("error_file_id" if errors else "output_file_id")
        if not file_id:
            return []
        return [
            json.loads(line) for line in self.file_content(file_id).splitlines() if line.strip()
        ]
