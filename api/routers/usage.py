"""``GET /v1/usage``: a tenant's own usage (tokens, cached prompt tokens, engine-seconds)
over the jobs that ended in a time range, in one total or per batch or UTC day; and
``GET /v1/usage/tenants``, every tenant's (operator key only)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Literal

from fastapi import APIRouter, Query

from api.deps import CtxDep, OperatorDep, TenantDep
from api.errors import ApiError
from api.views import usage_view
from worker.store.crud.usage import usage_rows

router = APIRouter(prefix="/v1/usage", tags=["usage"])

GroupBy = Literal["batch", "day"]
LAST_SECOND = 253_402_300_799  # 9999-12-31T23:59:59Z, the last instant a datetime holds
_START = Query(None, ge=0, le=LAST_SECOND,
               description="Unix seconds; jobs that ended at or after it (default: all)")
_END = Query(None, ge=0, le=LAST_SECOND,
             description="Unix seconds; jobs that ended before it (default: now on)")
_GROUP = Query(None, description="one row per batch (``batch_id`` null for jobs submitted "
                                 "alone) or per UTC day (``day``: YYYY-MM-DD); default: one row")


def _range(start: int | None, end: int | None) -> tuple[datetime | None, datetime | None]:
    """The range as aware datetimes; 400 when it is empty the wrong way round."""
    if start is not None and end is not None and end < start:
        raise ApiError(400, f"end ({end}) is before start ({start})", code="invalid_value",
                       param="end")
    def at(t: int | None) -> datetime | None:
        return None if t is None else datetime.fromtimestamp(t, timezone.utc)
    return at(start), at(end)


def _answer(ctx: Any, *, tenant: str | None, start: int | None, end: int | None,
            group_by: str | None) -> dict[str, Any]:
    lo, hi = _range(start, end)
    with ctx.reads() as session:
        rows = usage_rows(session=session, start=lo, end=hi, tenant=tenant, group_by=group_by)
    return {
        "object": "list",
        "start": start,
        "end": end,
        "group_by": group_by,
        "data": [{"object": "usage", **group, "jobs": totals.jobs, **usage_view(totals)}
                 for group, totals in rows],
    }


@router.get("", operation_id="getUsage")
def tenant_usage(
    *,
    start: int | None = _START,
    end: int | None = _END,
    group_by: GroupBy | None = _GROUP,
    ctx: CtxDep,
    tenant: TenantDep,
) -> dict[str, Any]:
    """The tenant's usage over the jobs that ended in ``[start, end)``: jobs, input and
    output tokens (OpenAI's usage object, the prompt tokens the prefix cache served as
    ``input_tokens_details.cached_tokens``) and ``engine_seconds``. Job rows removed by
    retention (``INFLIGHT_JOB_RETENTION_DAYS``) no longer count."""
    return _answer(ctx, tenant=tenant, start=start, end=end, group_by=group_by)


@router.get("/tenants", operation_id="getTenantsUsage")
def all_tenants_usage(
    *,
    start: int | None = _START,
    end: int | None = _END,
    group_by: GroupBy | None = _GROUP,
    ctx: CtxDep,
    _operator: OperatorDep,
) -> dict[str, Any]:
    """Every tenant's usage, one row per tenant (and per batch or day when grouped),
    operator key only."""
    return _answer(ctx, tenant=None, start=start, end=end, group_by=group_by)
