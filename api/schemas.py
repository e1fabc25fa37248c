"""Request bodies (pydantic), so the OpenAPI document describes them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from worker.protocol.limits import check_json_value


class StoredBody(BaseModel):
    """A request body the API stores. Before any field is validated, every top-level value
    passes the check every stored JSON value passes (``check_json_value``: finite numbers,
    strings UTF-8 can encode, bounded nesting), so what PostgreSQL would refuse (``1e400``,
    a lone surrogate) is a 400 naming its field (``LimitError``: see ``api.errors``)."""

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, value in data.items():
                check_json_value(value, param=str(name))
        return data


def callback_url_field(description: str) -> Any:
    """The ``callback_url`` field of a job or batch: an http(s) URL (its host is checked
    when it is submitted, and again at each delivery)."""
    return Field(None, max_length=2048, pattern=r"^https?://[^\s]+$", description=description)


class JobCreate(StoredBody):
    """An OpenAI chat-completions or completions body (``messages`` or ``prompt`` and the
    sampling fields, at the top level) plus the job fields below."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {
                    "messages": [{"role": "user", "content": "Say hi"}],
                    "max_tokens": 16,
                    "priority": 0,
                    "custom_id": "req-1",
                }
            ]
        },
    )

    endpoint: Literal["/v1/chat/completions", "/v1/completions"] | None = Field(
        None, description="default: chat when `messages` is given, completions for `prompt`"
    )
    priority: int = Field(0, ge=-1000, le=1000)
    custom_id: str | None = Field(None, min_length=1, max_length=512)
    idempotency_key: str | None = Field(
        None,
        min_length=1,
        max_length=255,
        description="the same key returns the same job (also the Idempotency-Key header)",
    )
    callback_url: str | None = callback_url_field("POSTed the job object when it ends")
    queue_class: Literal["interactive", "batch"] = "interactive"
    dry_run: bool = Field(
        False, description="answer the estimate (prompt and output tokens, engine-seconds, "
                           "completion time) and create nothing")
    deadline: datetime | None = Field(
        None,
        description="batch work only (queue_class batch): when the job is due, RFC 3339 with "
        "a time zone or Unix seconds, in the future and at most 9999 hours away. Workers "
        "read batch work least slack first (deadline less the time the work ahead of it "
        "takes); a deadline is a scheduling target, not an expiry. Default for batch work: "
        "24 hours after submission",
    )


EXPIRES_MIN_S = 3600  # OpenAI's bounds of expires_after.seconds: one hour ...
EXPIRES_MAX_S = 2_592_000  # ... to 30 days


class ExpiresAfter(BaseModel):
    """OpenAI's expiration policy of a file: ``seconds`` after its ``created_at``."""

    model_config = ConfigDict(extra="forbid")

    anchor: Literal["created_at"]
    seconds: int = Field(ge=EXPIRES_MIN_S, le=EXPIRES_MAX_S, strict=True)


class BatchCreate(StoredBody):
    """The OpenAI ``POST /v1/batches`` body."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(min_length=1, max_length=64)
    endpoint: Literal["/v1/chat/completions", "/v1/completions"]
    completion_window: str = Field("24h", pattern=r"^[1-9][0-9]{0,3}h$")
    metadata: dict[str, str] | None = Field(None, max_length=16)
    output_expires_after: ExpiresAfter | None = Field(
        None, description="the output and error files expire this long after their creation"
    )
    callback_url: str | None = callback_url_field(
        "POSTed the batch's event (OpenAI's batch.completed, .failed, .expired, .cancelled) "
        "when it ends, signed")
    dry_run: bool = Field(
        False, description="answer the estimate (prompt and output tokens, engine-seconds, "
                           "completion time) and create nothing")


class BatchRetry(StoredBody):
    """The ``POST /v1/batches/{batch_id}/retry`` body: what differs from the batch retried
    (every field absent: the same)."""

    model_config = ConfigDict(extra="forbid")

    completion_window: str | None = Field(None, pattern=r"^[1-9][0-9]{0,3}h$")
    metadata: dict[str, str] | None = Field(None, max_length=16)
    output_expires_after: ExpiresAfter | None = None
    callback_url: str | None = callback_url_field("the batch's event goes here (default: "
                                                  "the retried batch's)")


JOB_META_FIELDS = frozenset(JobCreate.model_fields)


# What the creates answer, as documented in the OpenAPI schema (the views build the full
# objects): enough for clients and stateful fuzzing to follow the links by ``id``.
class JobObject(BaseModel):
    """A job as ``POST /v1/jobs`` answers it (``GET /v1/jobs/{job_id}`` has the rest)."""

    model_config = ConfigDict(extra="allow")
    id: str
    object: Literal["job"] = "job"
    status: str


class FileObject(BaseModel):
    """A stored file as ``POST /v1/files`` answers it."""

    model_config = ConfigDict(extra="allow")
    id: str
    object: Literal["file"] = "file"
    bytes: int
    purpose: str


class BatchObject(BaseModel):
    """A batch as ``POST /v1/batches`` answers it."""

    model_config = ConfigDict(extra="allow")
    id: str
    object: Literal["batch"] = "batch"
    status: str
    input_file_id: str
