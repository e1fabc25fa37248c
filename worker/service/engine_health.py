"""Tell a job that fails alone from an engine that fails whatever it runs.

After a failed step the loop runs a known-good probe (a one-token greedy request, alone in
the engine). If the probe fails too, the engine is broken (a CUDA error, out of memory, a
corrupt state): the worker hands every held job back unfailed and exits non-zero, so that
its supervisor restarts it and no job is failed for the worker's fault."""

from __future__ import annotations

import contextlib
import logging
import uuid
from typing import TYPE_CHECKING

from worker.protocol.sampling_params import SamplingParams

if TYPE_CHECKING:
    from worker.service.engine_api import EngineAPI

log = logging.getLogger(__name__)


class EngineBroken(RuntimeError):
    """The engine fails even a known-good request: stop taking work, hand jobs back, exit."""


def probe_engine(engine: EngineAPI, *, max_steps: int = 8) -> bool:
    """Run a one-token greedy request alone; whether the engine completes it (call it with
    no other request in the engine)."""
    request_id = f"__probe_{uuid.uuid4().hex[:8]}"
    try:
        ids = engine.tokenize(prompt="ping")
        engine.add_request(request_id, ids, SamplingParams(max_tokens=1, temperature=0.0))
        for _ in range(max_steps):
            outputs, _stats = engine.step()
            if any(o.request_id == request_id and o.finished for o in outputs):
                return True
    except Exception as exc:
        log.error("engine probe failed: %s: %s", type(exc).__name__, exc)
    with contextlib.suppress(Exception):
        engine.abort_request(request_id)
    return False
