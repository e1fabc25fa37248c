"""Service classes in the iterations table: num_running_interactive,
num_waiting_interactive, num_interactive_tokens

Written by the worker with each step's trace row (the rest of num_running, num_waiting
and the step's rows were batch); ``inflight top`` shows them per class. Null on rows
written before this revision.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("num_running_interactive", "num_waiting_interactive", "num_interactive_tokens")


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("iterations") as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, sa.Integer(), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("iterations") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
