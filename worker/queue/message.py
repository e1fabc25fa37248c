"""The stream message schema (versioned): what one entry of a job stream carries."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

SCHEMA_VERSION = 1


class MessageError(ValueError):
    """An entry that is not a job message this code understands."""


@dataclass
class JobMessage:
    """A job on its way to a worker. ``body`` is the stored request (``{"url", "body"}``);
    ``attempt`` counts how often it was (re-)published; ``traceparent`` is W3C trace context;
    ``deadline`` (epoch seconds) is when batch work is due: it chooses the lane the job is
    published to (``worker.queue.slack``; None on interactive work and on entries from
    before the lanes)."""

    job_id: str
    body: dict[str, Any]
    tenant: str = "default"
    priority: int = 0
    attempt: int = 0
    traceparent: str | None = None
    deadline: float | None = None

    def encode(self) -> dict[str, str]:
        """Flat string fields for XADD."""
        return {
            "v": str(SCHEMA_VERSION),
            "job_id": self.job_id,
            "tenant": self.tenant,
            "priority": str(self.priority),
            "attempt": str(self.attempt),
            "traceparent": self.traceparent or "",
            "deadline": "" if self.deadline is None else repr(float(self.deadline)),
            "body": json.dumps(self.body, separators=(",", ":")),
        }

    @classmethod
    def decode(cls, fields: dict[str, str]) -> JobMessage:
        """Parse stream fields; raises MessageError on an unknown version, a missing field
        or a body that is not a JSON object."""
        if not fields:
            raise MessageError("empty entry (deleted from the stream)")
        version = fields.get("v")
        if version != str(SCHEMA_VERSION):
            raise MessageError(
                f"message schema version {version!r}; this worker reads {SCHEMA_VERSION}"
            )
        try:
            body = json.loads(fields["body"])
            message = cls(
                job_id=fields["job_id"],
                body=body,
                tenant=fields.get("tenant") or "default",
                priority=int(fields.get("priority") or 0),
                attempt=int(fields.get("attempt") or 0),
                traceparent=fields.get("traceparent") or None,
                deadline=_deadline(fields.get("deadline")),
            )
        except (KeyError, ValueError, TypeError, RecursionError) as exc:
            raise MessageError(f"bad job message: {exc!r}") from None
        if not isinstance(body, dict):
            raise MessageError(
                f"bad job message: the body is a JSON {_json_kind(body)}, not an object"
            )
        return message


def _deadline(text: str | None) -> float | None:
    """A deadline field: empty (none) or finite epoch seconds (ValueError otherwise)."""
    if not text:
        return None
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"deadline {text!r} is not a finite number")
    return value


def _json_kind(value: Any) -> str:
    """The JSON type name of a decoded value (for error messages)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else type(value).__name__
