"""The ``run`` fixture of the Triton kernel tests (``triton_harness.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kernels.triton_harness import Run, runner


@pytest.fixture(scope="module")
def run() -> Iterator[Run]:
    """``run(fn, *args)``: ``fn`` in the Triton interpreter worker, or on CUDA."""
    yield from runner()
