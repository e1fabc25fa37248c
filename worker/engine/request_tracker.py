"""The engine's requests: sequences by id, the samples of n > 1 requests, per-request
timing, and the outputs handed back after each step."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from worker.engine.outputs import RequestMetrics, RequestOutput
from worker.engine.sampler import Sampler, make_generator
from worker.engine.scheduler import Scheduler
from worker.engine.sequence import Sequence
from worker.engine.step_plan import Appended, SampledTokens, ScheduledSequence, SchedulerOutput
from worker.engine.stopping import StopChecker
from worker.engine.structured import grammar_masks


@dataclass
class SampleGroup:
    """The n samples of one request: sample 0 prefills, the others fork from it."""

    n: int
    members: list[Sequence]
    forked: bool = False
    finished: dict[int, RequestOutput] = field(default_factory=dict)


class RequestTracker:
    """Sequences in the engine, by internal id (samples of n > 1 get ``#sampleK``)."""

    def __init__(self, *, stop_checker: StopChecker, device: torch.device) -> None:
        self.stop_checker = stop_checker
        self.device = device
        self.sequences: dict[str, Sequence] = {}
        self.groups: dict[str, SampleGroup] = {}  # requests with n > 1, by request id
        self.aborted: list[Sequence] = []  # to report in the next step
        self.errors: dict[str, str] = {}  # by sequence id: why a failed one ended

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.sequences or request_id in self.groups

    def add(self, seq: Sequence) -> None:
        """Track a new request's (first) sequence."""
        self.sequences[seq.request_id] = seq
        if seq.params.n > 1:
            seq.group_id = seq.request_id
            self.groups[seq.request_id] = SampleGroup(seq.params.n, [seq])

    def abort(self, request_id: str, scheduler: Scheduler) -> None:
        """End every sample of a request now (their blocks freed); reported next step."""
        group = self.groups.get(request_id)
        members = group.members if group else [self.sequences.get(request_id)]
        for seq in members:
            if seq is None or seq.is_finished:
                continue
            scheduler.remove(seq, keep_cached=False)
            seq.finish_reason = "abort"
            self.aborted.append(seq)
        if group:
            group.n, group.forked = len(group.members), True  # no more samples will be made

    def fail(self, seq: Sequence, error: str, scheduler: Scheduler) -> None:
        """End one sequence whose row could not be sampled; reported with ``error``."""
        scheduler.remove(seq, keep_cached=False)
        seq.finish_reason = "abort"
        self.errors[seq.request_id] = error
        self.aborted.append(seq)

    def report_aborted(self, now: float) -> list[RequestOutput]:
        """Final outputs of the requests aborted since the last step."""
        outputs = [o for seq in self.aborted if (o := self._finish(seq, now, [])) is not None]
        self.aborted = []
        return outputs

    def note_scheduled(self, plan: SchedulerOutput, step: int, now: float) -> None:
        """Stamp first/last scheduled step and time on the sequences that ran."""
        for s in plan.scheduled:
            if s.is_pad:
                continue
            metrics = s.seq.metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now
                metrics.first_step = step
            metrics.last_step = step

    def fork(
        self, s: ScheduledSequence, logits_row: torch.Tensor, *, sampler: Sampler, scheduler: Scheduler
    ) -> list[SampledTokens]:
        """Samples 1..n-1 of a request whose prompt this step computed: they share its
        blocks by reference count and draw their first token from the same logits row."""
        leader = s.seq
        group = self.groups.get(leader.group_id or "")
        if group is None or group.forked:
            return []
        group.forked = True
        children = []
        for k in range(1, group.n):
            seed = leader.params.seed
            child = Sequence(
                request_id=f"{leader.request_id}#sample{k}", prompt_token_ids=leader.prompt_token_ids,
                params=leader.params, metrics=RequestMetrics(
                    arrival_time=leader.metrics.arrival_time,
                    first_scheduled_time=leader.metrics.first_scheduled_time,
                    first_step=leader.metrics.first_step, last_step=leader.metrics.last_step,
                ),
                prompt=leader.prompt, priority=leader.priority, tenant=leader.tenant,
                service_class=leader.service_class,
                generator=make_generator(None if seed is None else seed + k, self.device),
                max_tokens=leader.max_tokens, group_id=leader.request_id, sample_index=k,
            )
            child.grammar = leader.grammar.fresh() if leader.grammar is not None else None
            child.prompt_logprobs = None  # the request's prompt is scored once, by its leader
            scheduler.block_manager.fork(leader, child)
            child.num_computed_tokens = s.start + s.num_real_tokens  # the leader's, after this step
            scheduler.add_running(child)
            self.sequences[child.request_id] = child
            group.members.append(child)
            children.append(child)
        batch = logits_row.unsqueeze(0).repeat(len(children), 1)  # [n - 1, vocab]
        constrained = [(i, c.grammar) for i, c in enumerate(children) if c.grammar is not None]
        drawn = sampler.sample(batch, children, constrain=grammar_masks(constrained))
        return [SampledTokens(c, [(t, lp)]) for c, t, lp in zip(children, drawn.token_ids, drawn.logprobs, strict=True)]

    def check_stop(self, seq: Sequence) -> bool:
        """Apply the stop checker after one appended token; True when the sequence ends."""
        decision = self.stop_checker.check(
            prompt_len=seq.num_prompt_tokens, output_token_ids=seq.output_token_ids, params=seq.params
        )
        if decision.finish_reason is None and seq.num_output_tokens >= seq.max_tokens:
            decision.finish_reason = "length"  # max_tokens=None resolved to the context
        if decision.finish_reason is None:
            return False
        seq.finish_reason = decision.finish_reason
        seq.stop_reason = decision.stop_reason
        if decision.text is not None:
            seq.text = decision.text
        return True

    def outputs(self, appended: list[Appended], now: float) -> list[RequestOutput]:
        """The outputs of one step's appends (finished requests complete)."""
        outputs = []
        for a in appended:
            if a.seq.metrics.first_token_time is None:
                a.seq.metrics.first_token_time = now
            if not a.finished:
                outputs.append(self._output(a.seq, a.new_token_ids))
            elif (final := self._finish(a.seq, now, a.new_token_ids)) is not None:
                outputs.append(final)
        return outputs

    def _finish(self, seq: Sequence, now: float, new_tokens: list[int]) -> RequestOutput | None:
        """The final output of a finished sequence; for n > 1, of the whole request once its
        last sample ends (None before that)."""
        seq.metrics.finished_time = now
        if seq.text is None:  # a stop string sets it (possibly to ""), else decode now
            seq.text = self.stop_checker.final_text(seq.output_token_ids, seq.params)
        del self.sequences[seq.request_id]
        out = self._output(seq, new_tokens)
        out.finished = True
        out.error = self.errors.pop(seq.request_id, None)
        group = self.groups.get(seq.group_id or "")
        if group is None:
            return out
        group.finished[seq.sample_index] = out
        if len(group.finished) < (group.n if group.forked else 1):
            return None
        del self.groups[seq.group_id or ""]
        samples = [group.finished[i] for i in sorted(group.finished)]
        first = samples[0]
        return replace(first, request_id=seq.group_id or first.request_id, samples=samples)

    @staticmethod
    def _output(seq: Sequence, new_tokens: list[int]) -> RequestOutput:
        return RequestOutput(
            request_id=seq.group_id or seq.request_id,
            index=seq.sample_index,
            prompt=seq.prompt,
            prompt_token_ids=seq.prompt_token_ids,
            text=seq.text or "",
            token_ids=list(seq.output_token_ids) if seq.is_finished else seq.output_token_ids,
            finish_reason=seq.finish_reason,
            metrics=seq.metrics,
            new_token_ids=new_tokens,
            logprobs=seq.logprobs,
            stop_reason=seq.stop_reason,
            prompt_logprobs=seq.prompt_logprobs,
        )
