"""The one grammar-compile service (``worker.engine.grammar_service``): a compile past the
bound is refused and its helper killed; unrelated constraints compile side by side (no
process-wide lock); checks beyond the helpers wait briefly, then are busy; the cache
answers a constraint's second check without a compile. A slow helper is injected through
the service's ``command`` seam (it answers after sleeping)."""

from __future__ import annotations

import sys
import threading
import time

from worker.engine.grammar_service import BUSY, OK, TOO_COMPLEX, GrammarService

SLOW_HELPER = (
    "import json, sys, time\n"
    "print(json.dumps({'ready': True}), flush=True)\n"
    "for line in sys.stdin:\n"
    "    time.sleep(float(sys.argv[1]))\n"
    "    print(json.dumps({'error': None}), flush=True)\n"
)


def slow_helper(seconds: float) -> list[str]:
    """A helper that answers every constraint ok after ``seconds``."""
    return [sys.executable, "-c", SLOW_HELPER, str(seconds)]


def nested_schema(width: int, depth: int) -> dict:
    """A JSON schema of objects ``depth`` deep, ``width`` required properties each."""
    s: dict = {"type": "string"}
    for _ in range(depth):
        s = {"type": "object", "properties": {f"p{i}": s for i in range(width)},
             "required": [f"p{i}" for i in range(width)]}
    return s


def slow_schema() -> dict:
    """A moderately complex JSON schema within the 64 KiB limit (51 KB): 600 integer
    properties, each with its own 15-digit range; ~0.4 s for xgrammar to build on the
    test box, so far past a 0.05 s bound."""
    return {"type": "object", "properties": {
        f"p{i}": {"type": "integer", "minimum": -123456789012345 + i,
                  "maximum": 987654321098765 - i} for i in range(600)}}


def _timed(fn):
    t0 = time.monotonic()
    out = fn()
    return out, time.monotonic() - t0


def test_a_real_compile_past_the_bound_is_refused_and_its_helper_killed() -> None:
    svc = GrammarService(timeout_s=0.05)
    try:
        assert svc.check({"type": "regex", "pattern": "a+"}).status == OK  # starts a helper
        helper = svc._idle[0]
        verdict, took = _timed(lambda: svc.check(
            {"type": "json_schema", "schema": slow_schema()}))
        assert verdict.status == TOO_COMPLEX and verdict.param == "response_format"
        assert "did not compile within 0.05s" in verdict.message
        assert took < 0.5  # refused at the bound, not when the compile would have ended
        assert helper.proc.poll() is not None  # the runaway compile was killed
        assert svc.check({"type": "regex", "pattern": "b+"}).status == OK  # a fresh helper
    finally:
        svc.close()


def test_the_cache_answers_a_second_check_without_compiling() -> None:
    svc = GrammarService(timeout_s=5, command=slow_helper(0.4))
    spec = {"type": "json_schema", "schema": nested_schema(3, 2)}
    try:
        svc.check({"type": "regex", "pattern": "warm"})  # the helper's start, not measured
        first, t1 = _timed(lambda: svc.check(spec))
        # the same constraint, keys in another order: the canonical text is the key
        again = {"schema": spec["schema"], "type": "json_schema"}
        second, t2 = _timed(lambda: svc.check(again))
        assert first.status == second.status == OK
        assert t1 >= 0.4 and t2 < 0.05, (t1, t2)
        assert svc.compiles == 2  # "warm" and the schema once
    finally:
        svc.close()


def test_unrelated_constraints_compile_side_by_side_and_excess_is_busy() -> None:
    svc = GrammarService(timeout_s=5, max_concurrent=2, wait_s=0.2, max_waiting=1,
                         command=slow_helper(1.0))
    try:
        # start both helpers first (their start is not what is measured)
        warm = [threading.Thread(target=svc.check, args=({"type": "regex", "pattern": p},))
                for p in ("w1", "w2")]
        for t in warm:
            t.start()
        for t in warm:
            t.join()
        results: dict[str, tuple[str, float]] = {}

        def check(name: str) -> None:
            verdict, took = _timed(lambda: svc.check({"type": "regex", "pattern": name}))
            results[name] = (verdict.status, took)

        threads = [threading.Thread(target=check, args=(f"p{i}",)) for i in range(6)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        statuses = sorted(s for s, _ in results.values())
        assert statuses.count(OK) == 2 and statuses.count(BUSY) == 4, results
        assert wall < 1.8, wall  # two 1 s compiles side by side, not one after the other
        assert all(took < 0.5 for s, took in results.values() if s == BUSY), results
    finally:
        svc.close()
