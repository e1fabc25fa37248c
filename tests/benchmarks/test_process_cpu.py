"""benchmarks/process_cpu.py: a process tree's CPU seconds include its children's."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from benchmarks.process_cpu import cores_used, cpu_sample

BURN = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_tree_counts_the_cpu_of_its_grandchildren() -> None:
    # a shell (the root) whose child burns 0.6 s of CPU, then sleeps to be sampled alive
    script = f"{sys.executable} -c '{BURN}time.sleep(5)'"
    root = subprocess.Popen(["/bin/sh", "-c", script + "; true"])
    try:
        first = cpu_sample({"tree": root.pid}, ("no-such-process",))
        time.sleep(1.5)
        last = cpu_sample({"tree": root.pid}, ("no-such-process",))
    finally:
        root.kill()
        root.wait()
    used = cores_used(first, last, 1.5)
    assert 0.5 <= last["tree"] <= 1.5  # the grandchild's 0.6 s, alive at the second sample
    assert used["tree"] == pytest.approx((last["tree"] - first["tree"]) / 1.5)
    assert used["no-such-process"] == 0.0 and used["self"] >= 0.0
    assert set(used) == {"tree", "self", "no-such-process"}
