"""Liveness and readiness (no key needed) and Prometheus metrics (operator key)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from sqlalchemy import text

from api.control.models import known_models
from api.deps import CtxDep, OperatorDep
from api.metrics import gauge_lines, label_value
from worker.queue.keys import QUEUE_CLASSES

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
        streams = [
            (model, queue_class, ctx.keys.for_model(model).stream(queue_class))
            for model in models
            for queue_class in QUEUE_CLASSES
        ]
        pipe = ctx.redis.pipeline(transaction=False)
        for _model, _queue_class, stream in streams:
            pipe.xlen(stream)
        lengths = pipe.execute()
        lines += gauge_lines(
            "inflight_stream_length",
            "Entries in each job stream (of each model served recently or declared).",
            [
                (f'model="{label_value(m)}",stream="{c}"', n)
                for (m, c, _s), n in zip(streams, lengths, strict=True)
            ],
        )
    except Exception:
        lines += gauge_lines("inflight_redis_up", "Whether Redis answered.", [("", 0)])
    return PlainTextResponse(
        "\n".join(lines) + "\n", media_type="text/plain; version=0.0.4; charset=utf-8"
    )
