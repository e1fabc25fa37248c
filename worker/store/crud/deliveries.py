"""One delivery attempt of an outbox row (a job's webhook in ``api_jobs``, a batch's event in
``batches``): delivered, retried later, or failed for good, written only while the claimer's
:class:`~worker.store.crud.leases.Lease` holds the row."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import InstrumentedAttribute, Session

from worker.store.crud.leases import Lease


@dataclass(frozen=True)
class DeliveryColumns:
    """Where a table keeps a delivery's state, attempt count and last error (the next try
    is the lease's expiry column)."""

    state: InstrumentedAttribute[Any]
    attempts: InstrumentedAttribute[Any]
    error: InstrumentedAttribute[Any]


def record_attempt(
    *,
    session: Session,
    lease: Lease,
    columns: DeliveryColumns,
    key: str,
    delivered: bool,
    error: str | None = None,
    next_at: datetime | None = None,
    give_up: bool = False,
) -> bool:
    """Count one attempt on row ``key`` (delivered, retried at ``next_at``, or failed for
    good) and release the lease; False (nothing written) when the lease ran out and
    another claimer holds the row."""
    state = "delivered" if delivered else ("failed" if give_up else "pending")
    return lease.write(
        session,
        key,
        **{columns.state.key: state, columns.attempts.key: columns.attempts + 1,
           lease.columns.until.key: next_at, columns.error.key: error},
    )
