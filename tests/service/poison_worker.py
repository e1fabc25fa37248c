"""``inflight worker`` whose process dies (os._exit) when it admits a prompt containing
POISON: a job that crashes every worker it reaches."""

from __future__ import annotations

import os
import sys


def main() -> int:
    """Patch the engine, then run the normal command line."""
    from worker.engine import LLMEngine

    original = LLMEngine.add_request

    def add_request(self, request_id, prompt_token_ids, params=None, **kw):  # type: ignore[no-untyped-def]
        if "POISON" in (kw.get("prompt") or ""):
            os._exit(17)
        return original(self, request_id, prompt_token_ids, params, **kw)

    LLMEngine.add_request = add_request  # type: ignore[method-assign]
    from worker.cli.main import main as cli_main

    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
