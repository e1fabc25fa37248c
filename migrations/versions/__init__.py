"""Revision files (Alembic skips this one)."""
