"""``inflight worker`` whose engine sleeps ``INFLIGHT_TEST_STEP_S`` per step, so a test can
kill it mid-run; with ``INFLIGHT_TEST_POISON`` set, admitting a prompt that contains that
word kills the process (``os._exit(17)``): a job that crashes every worker it reaches."""

from __future__ import annotations

import os
import sys
import time


def main() -> int:
    """Patch the engine, then run the normal command line."""
    from worker.engine import LLMEngine

    step_s = float(os.environ.get("INFLIGHT_TEST_STEP_S", "0"))
    poison = os.environ.get("INFLIGHT_TEST_POISON")
    original_step, original_add = LLMEngine.step, LLMEngine.add_request

    def step(self, between_layers=None):  # type: ignore[no-untyped-def]
        time.sleep(step_s)
        return original_step(self, between_layers)

    def add_request(self, request_id, prompt_token_ids, params=None, **kw):  # type: ignore[no-untyped-def]
        if poison and poison in (kw.get("prompt") or ""):
            os._exit(17)
        return original_add(self, request_id, prompt_token_ids, params, **kw)

    LLMEngine.step = step  # type: ignore[method-assign]
    LLMEngine.add_request = add_request  # type: ignore[method-assign]
    from cli.main import main as cli_main

    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
