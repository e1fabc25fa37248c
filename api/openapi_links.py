"""OpenAPI links between operations: what a create answers feeds the reads and the cancel
of what it created (``$response.body#/id``). Clients and stateful fuzzing
(``tests/api/test_schemathesis.py``) follow them; the operation ids they name are set on
the routes."""

from __future__ import annotations

from typing import Any


def links_to(param: str, *operation_ids: str) -> dict[str, Any]:
    """A ``links`` object passing the created object's ``id`` as ``param`` to each of
    ``operation_ids``."""
    return {
        op: {"operationId": op, "parameters": {param: "$response.body#/id"}}
        for op in operation_ids
    }
