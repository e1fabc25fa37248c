"""The API's backpressure: refuse a submission (429 queue full, 503 queue refusing writes,
both with ``Retry-After``) before anything is written for it."""

from __future__ import annotations

from api.context import Context
from api.errors import ApiError
from worker.queue.admission import RETRY_AFTER_FULL_S, QueueRefused, admit


def admit_or_refuse(ctx: Context, queue_class: str, offered: int = 1, *, model: str) -> None:
    """Raise the 429/503 ApiError when ``queue_class`` of ``model`` cannot take ``offered``
    jobs now (a batch offers its lines: it is refused when they would pass the queue's
    bound)."""
    try:
        got = admit(
            redis_client=ctx.redis,
            keys=ctx.keys.for_model(model),
            queue_class=queue_class,
            offered=offered,
            max_depth=ctx.settings.max_queue_depth,
        )
    except QueueRefused as exc:
        raise refusal(exc) from exc
    if got.room < offered:
        raise refusal(
            QueueRefused(
                f"the {queue_class} queue of model {model!r} has room for {got.room} more entries, "
                f"{offered} asked (bound {ctx.settings.max_queue_depth})",
                full=True,
                retry_after=RETRY_AFTER_FULL_S,
            )
        )


def refusal(exc: QueueRefused) -> ApiError:
    """The 429 (queue full) or 503 (Redis refusing or unreachable) answer, with Retry-After."""
    return ApiError(
        429 if exc.full else 503,
        f"{exc}; retry after {exc.retry_after} s",
        code="queue_full" if exc.full else "queue_unavailable",
        headers={"Retry-After": str(exc.retry_after)},
    )
