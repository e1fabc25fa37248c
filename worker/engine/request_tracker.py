"""The engine's requests by id, and the outputs handed back after each step (as vLLM V1's
output processor: per-request timestamps, the n samples of a request gathered into one
final output). What ends a request is the scheduler's to decide (``Scheduler.finish``)."""

from __future__ import annotations

from dataclasses import replace

from worker.engine.outputs import RequestOutput
from worker.engine.sequence import Sequence
from worker.engine.step_plan import Appended


class RequestTracker:
    """Requests in the engine, by request id, until their final output is handed back."""

    def __init__(self) -> None:
        self.requests: dict[str, Sequence] = {}  # by request id: its (first) sequence
        self.aborted: list[Sequence] = []  # ended between steps: reported by the next one

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.requests

    def add(self, seq: Sequence) -> None:
        """Track a new request by its (first) sequence."""
        self.requests[seq.request_id] = seq

    def unfinished(self, request_id: str) -> list[Sequence]:
        """The sequences of a request (all its samples) that have not ended yet."""
        seq = self.requests.get(request_id)
        members = [] if seq is None else seq.group.members if seq.group is not None else [seq]
        return [s for s in members if not s.is_finished]

    @property
    def sequences(self) -> dict[str, Sequence]:
        """Sequences whose final output is still to come, by internal id (samples of n > 1
        get ``#sampleK``)."""
        out = {}
        for seq in self.requests.values():
            group = seq.group
            for s in group.members if group is not None else [seq]:
                if group is None or s.sample_index not in group.finished:
                    out[s.request_id] = s
        return out

    def report_aborted(self, now: float) -> list[RequestOutput]:
        """Final outputs of the requests aborted since the last step."""
        outputs = [o for seq in self.aborted if (o := self._final(seq, now, [])) is not None]
        self.aborted = []
        return outputs

    def outputs(self, appended: list[Appended], now: float) -> list[RequestOutput]:
        """The outputs of one step's appends (finished requests complete)."""
        outputs = []
        output = self._output
        for a in appended:
            metrics = a.seq.metrics
            if metrics.first_token_time is None and a.new_token_ids:
                metrics.first_token_time = now
            if not a.finished:
                outputs.append(output(a.seq, a.new_token_ids))
            elif (final := self._final(a.seq, now, a.new_token_ids)) is not None:
                outputs.append(final)
        return outputs

    def _final(self, seq: Sequence, now: float, new_tokens: list[int]) -> RequestOutput | None:
        """The final output of an ended sequence; for n > 1, of the whole request once its
        last sample ends (None before that)."""
        seq.metrics.finished_time = now
        out = self._output(seq, new_tokens)
        out.finished = True
        group = seq.group
        if group is None:
            del self.requests[seq.request_id]
            return out
        group.finished[seq.sample_index] = out
        if len(group.finished) < len(group.members):
            return None
        request_id = seq.group_id or seq.request_id
        del self.requests[request_id]
        samples = [group.finished[i] for i in sorted(group.finished)]
        return replace(samples[0], request_id=request_id, samples=samples)

    @staticmethod
    def _output(seq: Sequence, new_tokens: list[int]) -> RequestOutput:
        finished = seq.is_finished
        # positional, in RequestOutput's field order (one per sequence per step: the hot path)
        return RequestOutput(
            seq.group_id or seq.request_id,  # request_id
            seq.prompt,
            seq.prompt_token_ids,
            seq.text or "",  # text
            list(seq.output_token_ids) if finished else seq.output_token_ids,  # token_ids
            seq.finish_reason,
            seq.metrics,
            False,  # finished: set by _final
            new_tokens,  # new_token_ids
            seq.logprobs,
            seq.stop_reason,
            seq.error,
            seq.sample_index,  # index
            [],  # samples
            seq.prompt_logprobs,
        )
