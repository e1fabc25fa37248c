"""The import direction of DESIGN.md, checked: the API and the store never pull in torch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

TORCH_FREE = [
    "worker.protocol.sampling_params",
    "worker.protocol.openai_batch",
    "worker.store",
    "worker.queue",
    "worker.jobs.enqueue",
    "worker.jobs.republish",
    "worker.telemetry",
    "api",
]


@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_imports_without_torch(module: str) -> None:
    code = (
        "import importlib, sys\n"
        f"importlib.import_module({module!r})\n"
        "heavy = sorted(m for m in ('torch', 'triton', 'transformers', 'worker.engine', 'kernels') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_worker_package_init_imports_nothing() -> None:
    import ast

    import worker

    tree = ast.parse(Path(worker.__file__).read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def test_import_linter_contracts_hold() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    lint = subprocess.run([str(lint_imports)], capture_output=True, text=True, timeout=300)
    assert lint.returncode == 0, lint.stdout[-3000:]
    summary = re.search(r"Contracts: (\d+) kept, (\d+) broken\.", lint.stdout)
    assert summary is not None, lint.stdout[-3000:]
    assert int(summary.group(2)) == 0 and int(summary.group(1)) >= 6
