"""Ids that must name one of the caller's own objects (path ids, cursors, filters)."""

from __future__ import annotations

from api.context import Context
from api.errors import known_id, not_found
from worker.store.crud.batches import get_batch
from worker.store.models import Batch


def owned_batch(ctx: Context, tenant: str, batch_id: str, *, param: str = "id") -> Batch:
    """The tenant's batch ``batch_id``; 404 naming ``param`` when it is absent or another
    tenant's (the two are not told apart)."""
    known_id("batch", batch_id, param=param)
    with ctx.reads() as session:
        batch = get_batch(session=session, batch_id=batch_id)
    if batch is None or batch.tenant != tenant:
        raise not_found("batch", batch_id, param=param)
    return batch
