"""Run test files in a pytest subprocess and read its JUnit XML: counts and failures.

The subprocess has its own environment (e.g. ``INFLIGHT_TRITON_TEST_DEVICE=cuda``) and a
time limit; a crash, a timeout or a missing pytest is a result, not an exception.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_FAILURES_KEPT = 20


@dataclass
class PytestResult:
    """What one pytest run did."""

    returncode: int | None  # None: it did not finish (timeout) or could not start
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)  # "test id: first line of the message"
    skip_reasons: list[str] = field(default_factory=list)  # distinct reasons
    output_tail: str = ""

    @property
    def ok(self) -> bool:
        """Finished, nothing failed or errored, and at least one test passed."""
        return self.returncode == 0 and not self.failed and not self.errors and self.passed > 0


def pytest_available() -> bool:
    """Whether pytest can be imported in this interpreter."""
    return importlib.util.find_spec("pytest") is not None


# Tests of these folders need Redis and SQL, which the GPU machine does not run.
SERVICE_TEST_DIRS = frozenset({"api", "service", "faults", "abuse"})


def gpu_marked_files(tests_dir: Path) -> list[Path]:
    """Test files that mark tests ``gpu``, outside the service test folders."""
    return sorted(p for p in tests_dir.rglob("test_*.py")
                  if not SERVICE_TEST_DIRS & set(p.relative_to(tests_dir).parts[:-1])
                  and "pytest.mark.gpu" in p.read_text(encoding="utf-8"))


def _parse_junit(path: Path, result: PytestResult) -> None:
    reasons: set[str] = set()
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        outcome = {child.tag for child in case}
        if "failure" in outcome or "error" in outcome:
            child = case.find("failure")
            if child is None:
                child = case.find("error")
            if "failure" in outcome:
                result.failed += 1
            else:
                result.errors += 1
            if len(result.failures) < MAX_FAILURES_KEPT and child is not None:
                message = (child.get("message") or "").strip().splitlines()
                result.failures.append(f"{test_id}: {message[0][:200] if message else ''}")
        elif "skipped" in outcome:
            result.skipped += 1
            skipped = case.find("skipped")
            if skipped is not None:
                reasons.add((skipped.get("message") or "").strip()[:200])
        else:
            result.passed += 1
    result.skip_reasons = sorted(reasons)


def parallel_args(max_workers: int = 8) -> list[str]:
    """pytest-xdist's ``-n`` over this machine's cores (at most ``max_workers``) where it is
    installed: each Triton test compiles its kernels, and compiles run on the CPU."""
    if importlib.util.find_spec("xdist") is None:
        return []
    return ["-n", str(max(1, min(max_workers, os.cpu_count() or 1)))]


def run_pytest(targets: Sequence[str | Path], *, extra_args: Sequence[str] = (),
               env: Mapping[str, str | None] | None = None, timeout_s: float,
               cwd: Path = REPO_ROOT) -> PytestResult:
    """``python -m pytest targets extra_args`` with ``env`` changes (None unsets a variable)."""
    environment = dict(os.environ)
    for key, value in (env or {}).items():
        if value is None:
            environment.pop(key, None)
        else:
            environment[key] = value
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   f"--junitxml={junit}", *map(str, targets), *extra_args]
        try:
            proc = subprocess.run(command, cwd=cwd, env=environment, capture_output=True,
                                  text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout if isinstance(exc.stdout, str) else ""
            return PytestResult(None, output_tail=f"timed out after {timeout_s:.0f}s\n{out[-2000:]}")
        result = PytestResult(proc.returncode, output_tail=(proc.stdout + proc.stderr)[-2000:])
        if junit.is_file():
            _parse_junit(junit, result)
    return result
