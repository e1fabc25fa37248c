"""``inflight worker`` whose engine breaks for good after ``INFLIGHT_TEST_FAIL_AFTER`` steps:
every later ``step()`` raises, whatever runs (a device that went bad)."""

from __future__ import annotations

import os
import sys


def main() -> int:
    """Patch the engine, then run the normal command line."""
    from worker.engine import LLMEngine

    original = LLMEngine.step
    fail_after = int(os.environ["INFLIGHT_TEST_FAIL_AFTER"])
    done = [0]

    def step(self, between_layers=None):  # type: ignore[no-untyped-def]
        if done[0] >= fail_after:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        done[0] += 1
        return original(self, between_layers)

    LLMEngine.step = step  # type: ignore[method-assign]
    from cli.main import main as cli_main

    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
