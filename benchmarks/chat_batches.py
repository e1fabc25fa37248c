"""The chat workload as an OpenAI Batch file, and one batch of it through a running
service stack: what ``engine_seconds.py`` and ``quote_accuracy.py`` share.

Each workload line (``benchmarks/chat_workload.jsonl``: a chat prompt as token ids and its
``max_tokens``) becomes a ``/v1/completions`` line with ``prompt`` the token ids, greedy."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

WORKLOAD = Path(__file__).resolve().parent / "chat_workload.jsonl"


def batch_file(lines: int, *, workload: Path = WORKLOAD) -> bytes:
    """The first ``lines`` requests of the workload as an OpenAI Batch input file."""
    out = []
    with open(workload, encoding="utf-8") as src:
        for i, raw in enumerate(src):
            if i >= lines:
                break
            req = json.loads(raw)
            body = {"prompt": req["prompt_token_ids"], "max_tokens": req["max_tokens"],
                    "temperature": 0}
            out.append(json.dumps({"custom_id": req["id"], "method": "POST",
                                   "url": "/v1/completions", "body": body}))
    return ("\n".join(out) + "\n").encode()


def upload(client: httpx.Client, data: bytes) -> str:
    """Upload a batch input file; its id."""
    r = client.post("/v1/files", data={"purpose": "batch"},
                    files={"file": ("chat.jsonl", data, "application/jsonl")})
    r.raise_for_status()
    return str(r.json()["id"])


def create(client: httpx.Client, file_id: str, *, window: str = "24h",
           dry_run: bool = False) -> dict[str, Any]:
    """``POST /v1/batches`` for ``file_id`` (a quote with ``dry_run``); the answer."""
    body: dict[str, Any] = {"input_file_id": file_id, "endpoint": "/v1/completions",
                            "completion_window": window}
    if dry_run:
        body["dry_run"] = True
    r = client.post("/v1/batches", json=body)
    r.raise_for_status()
    return dict(r.json())


def wait_completed(client: httpx.Client, batch_id: str, timeout: float = 7200) -> dict[str, Any]:
    """Poll the batch until it is completed (RuntimeError if it ends otherwise)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = client.get(f"/v1/batches/{batch_id}").json()
        if view["status"] == "completed":
            return dict(view)
        if view["status"] in ("failed", "expired", "cancelled"):
            raise RuntimeError(f"batch {batch_id} ended {view['status']}: {view['errors']}")
        time.sleep(0.5)
    raise RuntimeError(f"batch {batch_id} not completed in {timeout:.0f}s")
