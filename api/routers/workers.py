"""``GET /v1/workers``: the worker processes and their heartbeats."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi import APIRouter

from api.deps import CtxDep, OperatorDep
from api.views import epoch
from worker.store.base import utcnow
from worker.store.crud.workers import list_workers

router = APIRouter(prefix="/v1/workers", tags=["workers"])


@router.get("")
def get_workers(*, ctx: CtxDep, _operator: OperatorDep) -> dict[str, Any]:
    """Every known worker, latest heartbeat first, with whether it is alive (operator
    key only: hosts and pids are not for tenants)."""
    timeout = timedelta(seconds=ctx.settings.worker_timeout)
    now = utcnow()
    with ctx.session_factory() as session:
        rows = list_workers(session=session)
    data = [
        {
            "id": w.id,
            "object": "worker",
            "host": w.host,
            "pid": w.pid,
            "model": w.model,
            "status": w.status,
            "started_at": epoch(w.started_at),
            "heartbeat_at": epoch(w.heartbeat_at),
            "alive": w.status != "stopped" and now - w.heartbeat_at <= timeout,
        }
        for w in rows
    ]
    return {"object": "list", "data": data}
