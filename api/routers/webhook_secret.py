"""``/v1/webhook_secret``: the key this tenant's webhook deliveries are signed with. Only
a key that can write reads or rotates it: whoever holds it can forge deliveries."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.deps import CtxDep, WriterDep
from worker.store.crud.tenant_usage import rotate_webhook_secret, webhook_secret

router = APIRouter(prefix="/v1/webhook_secret", tags=["webhooks"])


@router.get("")
def get_secret(*, ctx: CtxDep, tenant: WriterDep) -> dict[str, Any]:
    """The tenant's signing secret (created on first use); see docs/api.md for how a
    receiver verifies ``X-Inflight-Signature``. 403 for a read-only key."""
    with ctx.session_factory.begin() as session:
        secret = webhook_secret(session=session, tenant=tenant)
    return {"object": "webhook_secret", "secret": secret, "algorithm": "HMAC-SHA256"}


@router.post("/rotate")
def rotate(*, ctx: CtxDep, tenant: WriterDep) -> dict[str, Any]:
    """Replace the tenant's signing secret; deliveries from now on use the new one.
    Concurrent rotations all succeed; the secret ends as the last one's."""
    with ctx.session_factory.begin() as session:
        secret = rotate_webhook_secret(session=session, tenant=tenant)
    return {"object": "webhook_secret", "secret": secret, "algorithm": "HMAC-SHA256"}
