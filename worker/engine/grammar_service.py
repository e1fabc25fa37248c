"""One bounded, cancellable grammar compile, used by the API's submission check
(``api/context.py``) and by the worker's intake (``worker/service/grammars.py``).

A structured-output constraint (normalized, see ``worker.protocol.structured_output``) is
compiled in a helper process, ``python -m worker.engine.grammar_probe``, one compile per
helper at a time, at most ``max_concurrent`` helpers. A compile that has not answered
within ``timeout_s`` is refused (``too_complex``) and its helper is killed; a caller that
finds every helper busy waits ``wait_s`` at most (and only while fewer than
``max_waiting`` others wait), then gets ``busy``. There is no process-wide lock: unrelated
constraints compile side by side, and the answers (ok, invalid, too complex) are kept in a
bounded LRU keyed by (kind, canonical spec text), so the second check of a constraint never
reaches a helper.

Why a process and not a thread (measured with xgrammar 0.2.9 on this project's CPU box):
``Grammar.from_json_schema`` and ``GrammarCompiler.compile_grammar`` release the GIL (a
1 ms ticker thread kept 82-88% of its ticks during 0.25-0.7 s compiles) but have no cancel
hook: a SIGALRM set for 50 ms into a 0.26 s schema build ran its handler at 0.26 s, when the
native call returned, and a Python thread cannot be stopped, so a runaway compile in a
thread would keep its core and its memory until it ended, however long. A child process
is killed at the bound (the test box: a fresh helper is ready ~2 s later).
The compiled grammar itself cannot usefully come back across the process boundary
(``CompiledGrammar.serialize_json`` of a grammar compiled in 0.04 s against a 49k-token
vocabulary: 64 MB of JSON, 3.2 s to write, 0.9 s to read), so for the worker the helper's
answer is the bounded proof: only a constraint the helper compiled within the bound, with
the engine's own tokenizer info, is then compiled in the worker process (on the intake
thread, a compile known to end), and the engine thread gets it precompiled.

This module imports neither torch nor xgrammar (the API imports it; the import contracts
keep both out of the API process); only the helper loads them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from worker.protocol.structured_output import param_of

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0  # one compile (INFLIGHT_GRAMMAR_TIMEOUT)
DEFAULT_MAX_CONCURRENT = 2  # helper processes compiling at once (INFLIGHT_GRAMMAR_CONCURRENCY)
DEFAULT_WAIT_S = 1.0  # how long a check waits for a free helper before "busy"
DEFAULT_MAX_WAITING = 8  # checks allowed to wait at once; more are "busy" at once
START_TIMEOUT_S = 120.0  # a helper's start (it imports torch and xgrammar: ~1.5 s)
CACHE_SIZE = 1024
PROBE = [sys.executable, "-m", "worker.engine.grammar_probe"]

OK, INVALID, TOO_COMPLEX, BUSY, UNAVAILABLE = "ok", "invalid", "too_complex", "busy", "unavailable"


@dataclass(frozen=True)
class Verdict:
    """The answer for one constraint: ``status`` is ok, invalid (the library refuses it:
    ``message``), too_complex (no answer within the bound, or the helper died on it), busy
    (no helper free in time) or unavailable (no helper could be started)."""

    status: str
    message: str = ""
    param: str = "response_format"

    @property
    def ok(self) -> bool:
        return self.status == OK


def cache_key(spec: dict[str, Any]) -> tuple[str, str]:
    """(grammar kind, canonical spec text): what the cache is keyed by."""
    return str(spec.get("type")), json.dumps(spec, sort_keys=True, separators=(",", ":"))


class _Helper:
    """One helper process, ready (it printed its ready line)."""

    def __init__(self, command: list[str], start_timeout_s: float) -> None:
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, bufsize=1,
        )
        try:
            line = self.read_line(start_timeout_s)
        except (TimeoutError, ValueError):
            self.kill()
            raise
        if not json.loads(line).get("ready"):
            self.kill()
            raise ValueError("the grammar helper did not say it was ready")

    def ask(self, text: str, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        return dict(json.loads(self.read_line(timeout_s)))

    def read_line(self, timeout_s: float) -> str:
        """One line, or TimeoutError, or ValueError when the helper ended."""
        out = self.proc.stdout
        assert out is not None
        ready, _, _ = select.select([out], [], [], max(timeout_s, 0.0))
        if not ready:
            raise TimeoutError(f"no answer in {timeout_s:g}s")
        line = out.readline()
        if not line:
            raise ValueError("the grammar helper ended")
        return line

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()


class GrammarService:
    """Bounded compiles in helper processes, with a shared cache (thread-safe).

    ``command``: the helper (default ``python -m worker.engine.grammar_probe``; the worker
    adds ``--tokenizer-info FILE``; tests inject a slow one). A helper answers one JSON line
    per constraint, after a ``{"ready": true}`` line once its imports are done: the bound
    counts the compile only, never the helper's start."""

    def __init__(
        self,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        wait_s: float = DEFAULT_WAIT_S,
        max_waiting: int = DEFAULT_MAX_WAITING,
        cache_size: int = CACHE_SIZE,
        command: list[str] | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.timeout_s, self.wait_s, self.max_waiting = timeout_s, wait_s, max_waiting
        self.max_concurrent, self.cache_size = max(1, max_concurrent), cache_size
        self.command = command or PROBE
        self.start_timeout_s = start_timeout_s
        self._slots = threading.BoundedSemaphore(self.max_concurrent)
        self._lock = threading.Lock()  # guards the lists and counters below, never a compile
        self._idle: list[_Helper] = []
        self._cache: OrderedDict[tuple[str, str], Verdict] = OrderedDict()
        self._waiting = 0
        self._closed = False
        self.compiles = 0  # questions that reached a helper (tests, metrics)

    def check(self, spec: dict[str, Any], *, wait_s: float | None = None) -> Verdict:
        """The verdict for ``spec``. ``wait_s`` None: wait for a helper at most the service's
        ``wait_s``, and not at all while ``max_waiting`` others already wait (a request
        path); a number: wait that long, whatever the queue (batch expansion, worker)."""
        key = cache_key(spec)
        cached = self._cached(key)
        if cached is not None:
            return cached
        patient = wait_s is not None
        with self._lock:
            if not patient and self._waiting >= self.max_waiting:
                return Verdict(BUSY, "too many structured-output constraints are being "
                               "checked at once", _param(spec))
            self._waiting += 1
        try:
            got = self._slots.acquire(timeout=self.wait_s if wait_s is None else wait_s)
        finally:
            with self._lock:
                self._waiting -= 1
        if not got:
            return Verdict(BUSY, "too many structured-output constraints are being checked "
                           "at once", _param(spec))
        try:
            cached = self._cached(key)  # answered while this one waited
            if cached is not None:
                return cached
            verdict = self._ask(key[1], spec)
        finally:
            self._slots.release()
        if verdict.status in (OK, INVALID, TOO_COMPLEX):
            with self._lock:
                self._cache[key] = verdict
                if len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return verdict

    def close(self) -> None:
        """Stop every idle helper (one compiling is stopped when its check returns)."""
        with self._lock:
            self._closed = True
            helpers, self._idle = self._idle, []
        for h in helpers:
            h.kill()

    def _cached(self, key: tuple[str, str]) -> Verdict | None:
        with self._lock:
            verdict = self._cache.get(key)
            if verdict is not None:
                self._cache.move_to_end(key)
            return verdict

    def _ask(self, text: str, spec: dict[str, Any]) -> Verdict:
        """One compile on a helper of this thread's slot."""
        param = _param(spec)
        try:
            helper = self._helper()
        except (OSError, ValueError, TimeoutError) as exc:
            log.warning("grammar helper could not start (%s)", exc)
            return Verdict(UNAVAILABLE, f"the grammar helper could not start: {exc}", param)
        self.compiles += 1
        started = time.monotonic()
        try:
            answer = helper.ask(text, self.timeout_s)
        except TimeoutError:
            helper.kill()
            log.info("grammar compile stopped after %.2fs (bound %gs)",
                     time.monotonic() - started, self.timeout_s)
            return Verdict(TOO_COMPLEX, f"{param}: the grammar did not compile within "
                           f"{self.timeout_s:g}s; simplify the constraint", param)
        except (OSError, ValueError) as exc:
            helper.kill()
            log.warning("grammar helper died on a constraint (%s)", exc)
            return Verdict(TOO_COMPLEX, f"{param}: the grammar compiler ran out of resources "
                           "on this constraint; simplify it", param)
        self._release(helper)
        if answer.get("error"):
            return Verdict(INVALID, str(answer["error"]), str(answer.get("param") or param))
        return Verdict(OK, param=param)

    def _helper(self) -> _Helper:
        with self._lock:
            while self._idle:
                h = self._idle.pop()
                if h.alive():
                    return h
                h.kill()
        return _Helper(self.command, self.start_timeout_s)

    def _release(self, helper: _Helper) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self.max_concurrent:
                self._idle.append(helper)
                return
        helper.kill()


def _param(spec: dict[str, Any]) -> str:
    return param_of(spec)
