"""Text deltas of streamed jobs, as the engine produces their tokens.

The engine decodes a sequence's text only when it finishes; a job that asked to stream
(:mod:`worker.queue.job_events`) gets its text as it grows: after each step, the new
tokens of each of its samples are decoded incrementally (a window from the last point
where the text was settled, as vLLM does, so each step costs the new tokens, not the whole
output) and the new characters become a delta. Text is held back while it could still
change: a trailing incomplete UTF-8 character (the decoder shows U+FFFD), and a tail that
could be the start of one of the request's stop strings (the final text is cut before a
stop string). The final result, committed to SQL, stays the record: the reader completes
the streamed text from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from worker.engine.outputs import RequestOutput
from worker.protocol.sampling_params import SamplingParams
from worker.queue.job_events import Delta

_REPLACEMENT = "\ufffd"


@dataclass
class _Sample:
    prefix: int = 0  # token offsets of the decoding window
    read: int = 0
    text: str = ""  # settled text
    sent: int = 0  # characters published


@dataclass
class _Job:
    stops: tuple[str, ...]
    skip_special_tokens: bool
    samples: dict[int, _Sample] = field(default_factory=dict)


class StreamTexts:
    """Per streamed job and sample: what was decoded and what was published."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._jobs: dict[str, _Job] = {}

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._jobs

    def add(self, job_id: str, params: SamplingParams) -> None:
        """Follow ``job_id`` (no-op without a tokenizer: nothing can be decoded)."""
        if self.tokenizer is None:
            return
        self._jobs[job_id] = _Job(tuple(s for s in params.stop if s), params.skip_special_tokens)

    def discard(self, job_ids: Any) -> None:
        """Forget these jobs (ended, aborted, handed back)."""
        for job_id in job_ids:
            self._jobs.pop(job_id, None)

    def update(self, out: RequestOutput) -> Delta | None:
        """The new publishable text of ``out`` (an unfinished sample's output), if any."""
        job = self._jobs.get(out.request_id)
        if job is None:
            return None
        s = job.samples.setdefault(out.index, _Sample())
        ids = out.token_ids
        if len(ids) > s.read:
            before = self._decode(ids[s.prefix : s.read], job)
            after = self._decode(ids[s.prefix :], job)
            if len(after) > len(before) and not after.endswith(_REPLACEMENT):
                s.text += after[len(before) :]
                s.prefix, s.read = s.read, len(ids)
        end = len(s.text) - _held_back(s.text, job.stops)
        if end <= s.sent:
            return None
        delta = Delta(job_id=out.request_id, index=out.index, pos=s.sent, text=s.text[s.sent : end])
        s.sent = end
        return delta

    def _decode(self, ids: list[int], job: _Job) -> str:
        if not ids:
            return ""
        text = self.tokenizer.decode(ids, skip_special_tokens=job.skip_special_tokens)
        return text if isinstance(text, str) else "".join(text)


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing characters of ``text`` could begin a stop string."""
    if not stops:
        return 0
    for k in range(min(len(text), max(len(s) for s in stops)), 0, -1):
        tail = text[-k:]
        if any(s.startswith(tail) for s in stops):
            return k
    return 0
