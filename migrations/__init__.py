"""Alembic migration scripts of the store (a top-level package, shipped in the wheel).

Imports worker.store (the models' metadata); worker.store never imports this package."""
