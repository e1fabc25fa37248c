"""Liveness and readiness (no key needed) and Prometheus metrics (operator key)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from sqlalchemy import text

from api.context import Context
from api.control.models import known_models
from api.deps import CtxDep, OperatorDep
from api.metrics import gauge_lines, label_value
from worker.queue.stream_stats import stream_stats

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(*, ctx: CtxDep) -> JSONResponse:
    """Ready when the database and Redis both answer (503 otherwise)."""
    checks: dict[str, Any] = {}
    try:
        with ctx.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"error: {type(exc).__name__}"
    try:
        ctx.redis.ping()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"error: {type(exc).__name__}"
    ok = all(v == "ok" for v in checks.values())
    return JSONResponse(
        {"status": "ok" if ok else "unavailable", "checks": checks}, status_code=200 if ok else 503
    )


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(*, request: Request, ctx: CtxDep, _operator: OperatorDep) -> PlainTextResponse:
    """Prometheus text: HTTP metrics, jobs by status, stream lengths, live workers."""
    from datetime import timedelta

    from worker.store.crud.jobs import count_by_status
    from worker.store.crud.workers import live_worker_ids

    lines = request.app.state.http_metrics.render()
    models: list[str] = []
    try:
        with ctx.session_factory() as session:
            counts = count_by_status(session=session)
            live = live_worker_ids(
                session=session, within=timedelta(seconds=ctx.settings.worker_timeout)
            )
        lines += gauge_lines(
            "inflight_jobs",
            "Jobs by status.",
            [(f'status="{s}"', n) for s, n in sorted(counts.items())],
        )
        lines += gauge_lines(
            "inflight_workers_live", "Workers with a recent heartbeat.", [("", len(live))]
        )
        models = known_models(ctx)
    except Exception:
        lines += gauge_lines("inflight_store_up", "Whether the SQL store answered.", [("", 0)])
    try:
        lines += queue_gauges(ctx, models)
    except Exception:
        lines += gauge_lines("inflight_redis_up", "Whether Redis answered.", [("", 0)])
    return PlainTextResponse(
        "\n".join(lines) + "\n", media_type="text/plain; version=0.0.4; charset=utf-8"
    )


def queue_gauges(ctx: Context, models: list[str]) -> list[str]:
    """The queue's gauges of each model: entries per class (a model's batch lanes
    together), its lanes, and the least slack among them (``worker.queue.slack``)."""
    length: list[tuple[str, float]] = []
    lanes: list[tuple[str, float]] = []
    least: list[tuple[str, float]] = []
    for model in models:
        stats = stream_stats(redis_client=ctx.redis, keys=ctx.keys.for_model(model))
        label = f'model="{label_value(model)}"'
        batch = [s for s in stats if s.kind == "batch"]
        length.append((f'{label},stream="interactive"', stats[0].length))
        length.append((f'{label},stream="batch"', sum(s.length for s in batch)))
        lanes.append((label, len(batch)))
        slacks = [s.slack for s in batch if s.slack is not None and s.lag]
        if slacks:
            least.append((label, round(min(slacks), 3)))
    return [
        *gauge_lines("inflight_stream_length", "Entries in each model's interactive stream and "
                     "in its batch lanes together (each model served recently or declared).",
                     length),
        *gauge_lines("inflight_batch_lanes", "Batch lanes (deadline buckets) of each model.",
                     lanes),
        *gauge_lines("inflight_batch_least_slack_seconds", "Seconds to spare of the tightest "
                     "batch lane with undelivered work, at the model's measured rate.", least),
    ]
