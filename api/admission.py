"""The API's backpressure: refuse a submission (429 queue full, 503 queue refusing writes,
both with ``Retry-After``) before anything is written for it."""

from __future__ import annotations

from api.context import Context
from api.errors import ApiError
from worker.queue.admission import QueueRefused, admit


def admit_or_refuse(ctx: Context, queue_class: str) -> None:
    """Raise the 429/503 ApiError when ``queue_class`` cannot take a job now."""
    try:
        admit(
            redis_client=ctx.redis,
            keys=ctx.keys,
            queue_class=queue_class,
            offered=1,
            max_depth=ctx.settings.max_queue_depth,
        )
    except QueueRefused as exc:
        raise refusal(exc) from exc


def refusal(exc: QueueRefused) -> ApiError:
    """The 429 (queue full) or 503 (Redis refusing or unreachable) answer, with Retry-After."""
    return ApiError(
        429 if exc.full else 503,
        f"{exc}; retry after {exc.retry_after} s",
        code="queue_full" if exc.full else "queue_unavailable",
        headers={"Retry-After": str(exc.retry_after)},
    )
