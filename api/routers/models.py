"""``GET /v1/models``: the models the live workers serve (OpenAI's model list, plus what
each worker registered: architecture, dtype, context length, worker ids)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi import APIRouter

from api.deps import CtxDep, TenantDep
from api.errors import model_not_found
from api.views import model_list_view, model_view
from worker.store.crud.served_models import served_model, served_models

router = APIRouter(prefix="/v1/models", tags=["models"])


@router.get("", operation_id="listModels")
def list_models(*, ctx: CtxDep, _tenant: TenantDep) -> dict[str, Any]:
    """Every model served by a worker seen within the worker timeout, by id."""
    with ctx.reads() as session:
        models = served_models(
            session=session, within=timedelta(seconds=ctx.settings.worker_timeout)
        )
    return model_list_view(models)


@router.get("/{model_id:path}", operation_id="getModel")
def get_model(*, model_id: str, ctx: CtxDep, _tenant: TenantDep) -> dict[str, Any]:
    """One served model (ids may hold a slash, as hub ids do); 404 ``model_not_found``
    when no live worker serves it."""
    with ctx.reads() as session:
        found = served_model(
            session=session,
            model_id=model_id,
            within=timedelta(seconds=ctx.settings.worker_timeout),
        )
    if found is None:
        raise model_not_found(model_id)
    return model_view(found)
