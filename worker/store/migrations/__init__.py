"""Alembic migration scripts of the store (shipped inside the package)."""
