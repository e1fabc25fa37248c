"""A native build killed half-way must not hang every later start.

torch's JIT build marks itself in progress with a ``lock`` file and waits without end while
that file exists; ``kernels.cpu_native.exclusive_build`` holds an ``flock`` (freed by the kernel
when its holder dies) and clears a ``lock`` file that no live build of ours can own.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernels import cpu_native


def test_builds_live_under_torch_extensions_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    directory = cpu_native.build_directory("inflight_example_avx2_0123456789")
    assert directory.is_relative_to(tmp_path) and directory.name.endswith("0123456789")


def test_a_stale_lock_from_a_killed_build_is_cleared(tmp_path: Path) -> None:
    (tmp_path / "lock").touch()  # what a build killed mid-compile leaves behind
    with cpu_native.exclusive_build(tmp_path):
        assert not (tmp_path / "lock").exists()


def test_a_live_build_is_waited_for_not_broken(tmp_path: Path) -> None:
    """Another process holding the build keeps its lock until it finishes; we enter after."""
    holder = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from kernels import cpu_native
        directory = Path({str(tmp_path)!r})
        with cpu_native.exclusive_build(directory):
            (directory / "lock").touch()  # torch's own marker of a build in progress
            print("holding", flush=True)
            time.sleep(1.0)
            (directory / "lock").unlink()
            (directory / "finished").touch()
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "holding"
        with cpu_native.exclusive_build(tmp_path):
            assert (tmp_path / "finished").exists()  # we got in only after the holder was done
    finally:
        child.wait(timeout=60)
    assert child.returncode == 0
