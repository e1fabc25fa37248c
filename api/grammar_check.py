"""The submission check of structured output: a constraint the grammar library cannot
compile is a 400 at submission (and an error line of a batch), not a failed job later.

The library (xgrammar) imports torch, which the API never does; so a helper process,
``python -m worker.engine.grammar_probe``, builds each constraint and answers. It starts on
the first constrained request and lives as long as the API; answers are cached by
constraint, so a batch whose lines share one schema asks once. When the helper cannot
answer (not installed, crashed, too slow) the request is accepted, as before this check:
the worker then fails the job alone with the library's reason.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from collections import OrderedDict
from typing import Any

from api.errors import ApiError

log = logging.getLogger(__name__)

PROBE = [sys.executable, "-m", "worker.engine.grammar_probe"]
CACHE_SIZE = 1024


class GrammarChecker:
    """One helper process and a cache of its answers (thread-safe)."""

    def __init__(self, *, timeout_s: float = 30.0, command: list[str] | None = None) -> None:
        self.timeout_s = timeout_s
        self.command = command or PROBE
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None
        self._answers: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def check(self, spec: dict[str, Any] | None) -> None:
        """Raise a 400 ApiError naming the field when the library refuses ``spec`` (a
        normalized constraint; None: nothing to check)."""
        if spec is None:
            return
        answer = self._answer(json.dumps(spec, sort_keys=True))
        if answer and answer.get("error"):
            raise ApiError(400, str(answer["error"]), code="invalid_request",
                           param=str(answer.get("param") or "response_format"))

    def close(self) -> None:
        """Stop the helper process."""
        with self._lock:
            self._stop()

    def _answer(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            if key in self._answers:
                self._answers.move_to_end(key)
                return self._answers[key]
            answer = self._ask(key)
            if answer is not None:
                self._answers[key] = answer
                if len(self._answers) > CACHE_SIZE:
                    self._answers.popitem(last=False)
            return answer

    def _ask(self, key: str) -> dict[str, Any] | None:
        """The helper's answer, or None when it cannot give one (logged)."""
        try:
            proc = self._started()
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(key + "\n")
            proc.stdin.flush()
            line = _read_line(proc, self.timeout_s)
            return json.loads(line)
        except (OSError, ValueError, TimeoutError) as exc:
            log.warning("structured output not checked at submission (%s); the worker "
                        "will check it", exc)
            self._stop()
            return None

    def _started(self) -> subprocess.Popen[str]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, text=True, bufsize=1,
            )
        return self._proc

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None


def _read_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """One answer line, or TimeoutError / ValueError (the helper ended)."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()),  # type: ignore[union-attr]
                              daemon=True)
    reader.start()
    reader.join(timeout_s)
    if reader.is_alive():
        raise TimeoutError(f"the grammar probe gave no answer in {timeout_s:g}s")
    if not got or not got[0]:
        raise ValueError("the grammar probe ended")
    return got[0]
