"""Text deltas of streamed jobs, as the engine produces their tokens.

The engine decodes a sequence's text only when it finishes; a job that asked to stream
(:mod:`worker.queue.job_events`) gets its text as it grows: after each step, the new
tokens of each of its samples are decoded incrementally (a window from the last point
where the text was settled, as vLLM does, so each step costs the new tokens, not the whole
output) and the new characters become a delta. Text is held back while it could still
change: a trailing incomplete UTF-8 character (the decoder shows U+FFFD), and a tail that
could be the start of one of the request's stop strings (the final text is cut before a
stop string). When the request asked for logprobs, each delta carries the scored
positions of the tokens whose text it completes (a group of tokens settles together: the
group's scores go with the delta that publishes the end of its text). The final result,
committed to SQL, stays the record: the reader completes the streamed text and scores
from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from worker.engine.outputs import RequestOutput, TokenLogprob
from worker.protocol.openai_batch import logprob_info, stored_logprobs
from worker.protocol.sampling_params import SamplingParams
from worker.queue.job_events import Delta
from worker.service.loop_output import clean, clean_logprob

_REPLACEMENT = "\ufffd"


@dataclass
class _Sample:
    prefix: int = 0  # token offsets of the decoding window
    read: int = 0
    text: str = ""  # settled text
    sent: int = 0  # characters published
    # (end of the group's text in ``text``, tokens settled with it), oldest first, whose
    # scores were not published yet
    groups: list[tuple[int, int]] = field(default_factory=list)
    scored: int = 0  # positions whose scores were published


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
                s.groups.append((len(s.text), s.read))
        end = len(s.text) - _held_back(s.text, job.stops)
        if end <= s.sent:
            return None
        delta = Delta(job_id=out.request_id, index=out.index, pos=s.sent,
                      text=clean(s.text[s.sent : end]) or "")
        s.sent = end
        if out.logprobs is not None:
            delta.lp_pos, delta.logprobs = s.scored, self._scores(out.logprobs, s)
        return delta

    def _scores(self, logprobs: list[TokenLogprob], s: _Sample) -> list[dict[str, Any]]:
        """The stored scores of the groups whose text is now published, named as the final
        result names them (``samples_of``, ``clean``)."""
        upto = s.scored
        while s.groups and s.groups[0][0] <= s.sent:
            upto = s.groups.pop(0)[1]
        infos = [clean_logprob(logprob_info(lp, self.tokenizer.decode))
                 for lp in logprobs[s.scored : upto]]
        s.scored = upto
        return stored_logprobs(infos)

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
