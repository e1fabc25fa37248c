"""FastAPI dependencies shared by the routers."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from api.context import Context


def get_ctx(request: Request) -> Context:
    """The app's Context."""
    ctx: Context = request.app.state.ctx
    return ctx


def _tenant(request: Request) -> str:
    from api.auth import current_tenant

    return current_tenant(request)


def _writer(request: Request) -> str:
    from api.auth import writing_tenant

    return writing_tenant(request)


def _operator(request: Request) -> None:
    from api.auth import require_operator

    require_operator(request)


CtxDep = Annotated[Context, Depends(get_ctx)]
"""The app's Context, as an endpoint parameter type."""

TenantDep = Annotated[str, Depends(_tenant)]
"""The authenticated tenant, as an endpoint parameter type."""

WriterDep = Annotated[str, Depends(_writer)]
"""The authenticated tenant of a key that can write (403 for a read-only key, even on a
GET), as an endpoint parameter type."""

OperatorDep = Annotated[None, Depends(_operator)]
"""Requires the operator key (``/metrics``, ``/v1/workers``)."""
