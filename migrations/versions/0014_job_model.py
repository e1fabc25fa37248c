"""Several models behind one API: jobs.model and batches.model

``jobs.model`` is the model id a job runs on: the stream it is published to (and
re-published to by the reconciler) and ``model`` in its answers. ``batches.model`` is the
model every line of a batch runs on.

Rows from before this revision get a model where one can be known: a job that ran takes
the model its worker registered (``workers.model_id``, or its ``--model`` spec); an open
job that never ran takes the model of the most recently started worker (a deployment from
before this revision read every job from one set of streams, so any of its workers could
have run it). Other rows stay NULL: their answers name the request's ``model`` as before,
and a worker adopts open jobs left NULL when it moves the old streams' entries
(``worker.jobs.legacy_keys``). Batches stay NULL; an expansion still running finds its
batch's model from the input file.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-10
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WORKERS_MODEL = "(SELECT COALESCE(w.model_id, w.model) FROM workers w WHERE w.id = jobs.worker_id)"
_LATEST_MODEL = (
    "(SELECT COALESCE(w.model_id, w.model) FROM workers w ORDER BY w.started_at DESC, w.id "
    "LIMIT 1)"
)


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("model", sa.String(length=255), nullable=True))
    with op.batch_alter_table("batches") as batch:
        batch.add_column(sa.Column("model", sa.String(length=255), nullable=True))
    op.execute(f"UPDATE jobs SET model = {_WORKERS_MODEL} WHERE worker_id IS NOT NULL")
    op.execute(
        f"UPDATE jobs SET model = {_LATEST_MODEL} "
        "WHERE model IS NULL AND status IN ('queued', 'running')"
    )


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("batches") as batch:
        batch.drop_column("model")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("model")
