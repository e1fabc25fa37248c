"""Per-job event streams: what a worker tells an API process that waits on one job
(``POST /v1/chat/completions`` and ``/v1/completions``).

A job's stored request (``{"url", "body"}``) may carry ``"events"``: ``"end"`` asks the
writer to announce the job's end once its result is committed; ``"deltas"`` asks the same
and, before it, the engine loop's text deltas as tokens are produced. Events go to the
stream ``keys.deltas(job_id)`` (capped at :data:`MAXLEN` entries, expiring
:data:`TTL_S` after its last write):

- ``{"t": "d", "i": <choice index>, "p": <offset of the text in the choice>, "x": <text>}``,
  plus, when the request asked for logprobs, ``"q"``: the position (token index in the
  choice) of the first scored token, and ``"l"``: the JSON list of the positions whose
  text this delta completes (``{"token", "logprob", "top"}`` each, the job store's form);
- ``{"t": "end", "s": <status>}``: the result (or failure) is in SQL now.

The events are a notification, not the record: a reader that misses them (the stream
expired, a worker died) reads the job from SQL.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from worker.queue.keys import QueueKeys

FIELD = "events"  # key of the stored request
END = "end"
DELTAS = "deltas"
KINDS = (END, DELTAS)
MAXLEN = 20_000  # entries kept per job (approximate trim)
TTL_S = 600  # a job's events expire this long after the last one


def wanted(stored: Any) -> str | None:
    """Which events the job's stored request asks for (None, END or DELTAS)."""
    if not isinstance(stored, dict):
        return None
    kind = stored.get(FIELD)
    return kind if kind in KINDS else None


@dataclass
class Delta:
    """New text of one choice of a streamed job, at character offset ``pos``; with the
    scored positions ``logprobs`` (stored form) from token ``lp_pos`` on, when asked."""

    job_id: str
    index: int
    pos: int
    text: str
    lp_pos: int = 0
    logprobs: list[dict[str, Any]] | None = None

    def fields(self) -> dict[str, str]:
        """The stream entry."""
        entry = {"t": "d", "i": str(self.index), "p": str(self.pos), "x": self.text}
        if self.logprobs is not None:
            entry["q"], entry["l"] = str(self.lp_pos), json.dumps(self.logprobs)
        return entry


def end_fields(status: str) -> dict[str, str]:
    """The entry announcing a job's end with ``status``."""
    return {"t": END, "s": status}


def publish_events(
    *, redis_client: redis.Redis, keys: QueueKeys, events: Sequence[tuple[str, dict[str, str]]]
) -> None:
    """XADD ``(job_id, fields)`` events to their jobs' streams in one pipeline, each stream
    capped and its expiry renewed."""
    if not events:
        return
    pipe = redis_client.pipeline(transaction=False)
    touched: set[str] = set()
    for job_id, fields in events:
        key = keys.deltas(job_id)
        pipe.xadd(key, fields, maxlen=MAXLEN, approximate=True)  # type: ignore[arg-type]
        touched.add(key)
    for key in touched:
        pipe.expire(key, TTL_S)
    pipe.execute()
