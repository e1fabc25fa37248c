"""Streamed chat requests timed as a client sees them: when the request was sent, when its
first content arrived, when its last content arrived, and how many tokens it had.

``POST /v1/chat/completions`` with ``stream: true`` and ``stream_options.include_usage``,
read as Server-Sent Events with httpx (what the ``openai`` SDK does underneath, without its
parsing cost in the measuring process). The role chunk the API sends before any token is
not a token: time to first token is taken at the first chunk carrying content.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import httpx


@dataclass
class StreamTiming:
    """One streamed request (``time.time()`` seconds; ``error`` set when it failed)."""

    sent: float
    first_token: float | None = None
    last_token: float | None = None
    completion_tokens: int = 0
    job_id: str | None = None
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        """Seconds from sending to the first content."""
        return None if self.first_token is None else self.first_token - self.sent

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first (None with fewer than two tokens)."""
        if self.first_token is None or self.last_token is None or self.completion_tokens < 2:
            return None
        return (self.last_token - self.first_token) / (self.completion_tokens - 1)

    def as_dict(self) -> dict[str, Any]:
        """The fields plus ttft and tpot (for the JSON report)."""
        return {**asdict(self), "ttft": self.ttft, "tpot": self.tpot}


async def timed_chat_stream(client: httpx.AsyncClient, body: dict[str, Any]) -> StreamTiming:
    """Send one streamed chat request and time it to ``[DONE]``."""
    timing = StreamTiming(sent=time.time())
    request = {**body, "stream": True, "stream_options": {"include_usage": True}}
    try:
        async with client.stream("POST", "/v1/chat/completions", json=request) as resp:
            if resp.status_code != 200:
                timing.error = f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}"
                return timing
            timing.job_id = resp.headers.get("X-Inflight-Job-Id")
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: "):])
                if "error" in chunk:
                    timing.error = str(chunk["error"].get("message"))
                    return timing
                if any(c.get("delta", {}).get("content") for c in chunk.get("choices") or []):
                    now = time.time()
                    timing.first_token = timing.first_token or now
                    timing.last_token = now
                if chunk.get("usage"):
                    timing.completion_tokens = int(chunk["usage"]["completion_tokens"])
    except httpx.HTTPError as exc:
        timing.error = f"{type(exc).__name__}: {exc}"
    return timing


async def steady_arrivals(client: httpx.AsyncClient, bodies: list[dict[str, Any]],
                          rate: float) -> list[StreamTiming]:
    """Send ``bodies`` at a steady ``rate`` per second (request i at i / rate seconds, each
    whatever the others are doing: an open loop) and wait for all of them."""
    start = time.monotonic()

    async def one(i: int, body: dict[str, Any]) -> StreamTiming:
        await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
        return await timed_chat_stream(client, body)

    return list(await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies))))


def run_steady(base_url: str, api_key: str, bodies: list[dict[str, Any]],
               rate: float) -> list[StreamTiming]:
    """:func:`steady_arrivals` on its own event loop and connection pool."""
    return asyncio.run(_with_client(base_url, api_key,
                                    lambda client: steady_arrivals(client, bodies, rate)))


def run_one_by_one(base_url: str, api_key: str,
                   bodies: list[dict[str, Any]]) -> list[StreamTiming]:
    """Each body alone, the next sent once the previous one ended."""

    async def each(client: httpx.AsyncClient) -> list[StreamTiming]:
        return [await timed_chat_stream(client, b) for b in bodies]

    return asyncio.run(_with_client(base_url, api_key, each))


async def _with_client(base_url: str, api_key: str,
                       work: Callable[[httpx.AsyncClient], Awaitable[list[StreamTiming]]],
                       ) -> list[StreamTiming]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(900.0),
                                 headers={"Authorization": f"Bearer {api_key}"},
                                 limits=limits) as client:
        return await work(client)
