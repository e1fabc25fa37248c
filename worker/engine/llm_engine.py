"""The incremental engine: add requests, step, collect outputs. No Redis, no SQL."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from kernels import get_backend
from worker.engine.block_manager import BlockManager
from worker.engine.config import DEFAULT_CPU_KV_CACHE_BYTES, EngineArgs
from worker.engine.model_runner import ModelRunner, kv_bytes_per_token
from worker.engine.models.cpu_linear import onednn_available, pack_linears
from worker.engine.models.llama import LlamaForPackedCausalLM
from worker.engine.models.loader import load_checkpoint
from worker.engine.outputs import RequestMetrics, RequestOutput, StepStats
from worker.engine.sampler import Sampler, make_generator
from worker.engine.scheduler import ScheduledSequence, Scheduler, SchedulerOutput
from worker.engine.sequence import Sequence, SequenceStatus
from worker.engine.speculation import NgramSpeculator, accept
from worker.engine.stopping import StopChecker
from worker.protocol.sampling_params import InvalidRequestError, SamplingParams

log = logging.getLogger(__name__)

# What one step appends to a sequence: (sequence, [(token, logprob)], drafts it checked).
Append = tuple[Sequence, list[tuple[int, Any]], int]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when available, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto`` is fp32 on the CPU (no bf16 matrix units here) and bf16 on CUDA."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


@dataclass
class SampleGroup:
    """The n samples of one request: sample 0 prefills, the others fork from it."""

    n: int
    members: list[Sequence]
    forked: bool = False
    finished: dict[int, RequestOutput] = field(default_factory=dict)


class LLMEngine:
    """Continuous batching over a paged KV pool, one ``step()`` at a time."""

    def __init__(self, args: EngineArgs | None = None, **kwargs: Any) -> None:
        self.args = args = args or EngineArgs(**kwargs)
        self.device = resolve_device(args.device)
        self.dtype = resolve_dtype(args.dtype, self.device)
        if args.num_threads and self.device.type == "cpu":
            torch.set_num_threads(args.num_threads)
        checkpoint = load_checkpoint(args.model, dtype=torch.float32)
        self.load_seconds = checkpoint.load_seconds
        self.model_name = args.model
        self.tokenizer = checkpoint.tokenizer
        config = checkpoint.config
        self.max_model_len = min(args.max_model_len or config.max_position_embeddings,
                                 config.max_position_embeddings)
        model = LlamaForPackedCausalLM(config, max_positions=self.max_model_len)
        model.load_hf_state_dict(checkpoint.state_dict)
        del checkpoint
        model.to(device=self.device, dtype=self.dtype).eval()
        self.prepacked = False
        if self.device.type == "cpu" and args.prepack_weights is not False:
            if onednn_available():
                self.prepacked = pack_linears(model) > 0
            elif args.prepack_weights:
                raise InvalidRequestError("prepack_weights=True needs a torch build with oneDNN")
        self.block_size = args.block_size
        num_blocks = self._num_kv_blocks(config)
        self.runner = ModelRunner(
            model=model, num_blocks=num_blocks, block_size=args.block_size, device=self.device,
            dtype=self.dtype, backend=get_backend(self.device, args.attention_backend),
            max_num_seqs=args.max_num_seqs, max_model_len=self.max_model_len,
            use_decode_graphs=args.decode_graphs,
        )
        self.block_manager = BlockManager(num_blocks, args.block_size, args.enable_prefix_caching)
        self.scheduler = Scheduler(
            block_manager=self.block_manager, max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens, policy=args.policy,
            enable_chunked_prefill=args.enable_chunked_prefill, tenant_weights=args.tenant_weights,
        )
        self.eos_token_ids = self._eos_token_ids(config)
        self.sampler = Sampler(eos_token_ids=self.eos_token_ids, device=self.device, seed=args.seed)
        self.stop_checker = StopChecker(
            tokenizer=self.tokenizer, eos_token_ids=self.eos_token_ids, max_model_len=self.max_model_len
        )
        self.speculator = (
            NgramSpeculator(num_tokens=args.num_speculative_tokens, max_rows=args.speculative_max_rows)
            if args.num_speculative_tokens > 0 else None
        )
        self.requests: dict[str, Sequence] = {}  # by internal id (samples of n > 1 get "#k")
        self.groups: dict[str, SampleGroup] = {}  # requests with n > 1, by request id
        self.aborted: list[Sequence] = []
        self.step_index = 0
        self.total_draft_tokens = 0  # speculative tokens checked, all steps
        self.total_accepted_tokens = 0  # of them, accepted
        log.info(
            "engine ready: %s on %s/%s, KV pool %d blocks x %d = %d tokens, backend %s, "
            "prepacked weights %s, load %.2fs",
            args.model, self.device, self.dtype, num_blocks, args.block_size,
            num_blocks * args.block_size, self.runner.backend.name, self.prepacked, self.load_seconds,
        )

    # -- set-up helpers ---------------------------------------------------------------
    def _num_kv_blocks(self, config) -> int:
        if self.args.num_kv_blocks is not None:
            return self.args.num_kv_blocks
        budget = self.args.kv_cache_memory
        if budget is None:
            if self.device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(self.device)
                budget = int(free * 0.8)
            else:
                budget = DEFAULT_CPU_KV_CACHE_BYTES
        per_block = kv_bytes_per_token(config, self.dtype) * self.args.block_size
        if budget < per_block:
            raise InvalidRequestError(f"kv_cache_memory={budget} bytes is smaller than one block ({per_block})")
        return budget // per_block

    def _eos_token_ids(self, config) -> set[int]:
        ids: set[int] = set()
        for source in (config.eos_token_id, self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif source:
                ids.update(source)
        return ids

    # -- requests ---------------------------------------------------------------------
    def tokenize(self, prompt: str | None = None, messages: list[dict] | None = None) -> list[int]:
        """Token ids of a plain prompt, or of chat messages through the chat template."""
        if (prompt is None) == (messages is None):
            raise InvalidRequestError("give exactly one of prompt or messages")
        try:
            if messages is not None:
                ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
                if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                    ids = ids["input_ids"]
                return list(ids)
            return list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        except Exception as exc:  # template errors, bad content types
            raise InvalidRequestError(f"could not tokenize the request: {exc}") from exc

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        *,
        prompt: str | None = None,
        priority: int = 0,
        tenant: str | None = None,
        arrival_time: float | None = None,
    ) -> None:
        """Queue a request; refuse at once (InvalidRequestError) one that can never fit."""
        params = params or SamplingParams()
        if request_id in self.requests or request_id in self.groups:
            raise InvalidRequestError(f"request id {request_id!r} is already in the engine")
        n = len(prompt_token_ids)
        if n == 0:
            raise InvalidRequestError("the prompt is empty")
        vocab = self.runner.model.config.vocab_size
        if any(not isinstance(t, int) or not 0 <= t < vocab for t in prompt_token_ids):
            raise InvalidRequestError(f"prompt token ids must be integers in [0, {vocab})")
        if n >= self.max_model_len:
            raise InvalidRequestError(
                f"the prompt has {n} tokens; this model's context is {self.max_model_len} "
                "and at least one token must be generated"
            )
        max_tokens = params.max_tokens if params.max_tokens is not None else self.max_model_len - n
        if n + max_tokens > self.max_model_len:
            raise InvalidRequestError(
                f"prompt ({n} tokens) + max_tokens ({max_tokens}) = {n + max_tokens} exceeds the "
                f"context of {self.max_model_len} tokens"
            )
        pool_tokens = self.block_manager.num_blocks * self.block_size
        if n + max_tokens > pool_tokens:
            raise InvalidRequestError(
                f"prompt ({n} tokens) + max_tokens ({max_tokens}) needs more KV than the whole "
                f"pool holds ({pool_tokens} tokens)"
            )
        seq = Sequence(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            params=params,
            metrics=RequestMetrics(arrival_time=arrival_time or time.time()),
            prompt=prompt,
            priority=priority,
            tenant=tenant,
            generator=make_generator(params.seed, self.device),
            max_tokens=max_tokens,
        )
        self.requests[request_id] = seq
        if params.n > 1:
            seq.group_id = request_id
            self.groups[request_id] = SampleGroup(params.n, [seq])
        self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> None:
        """Stop a request (all its samples) now and free its KV; the next step reports it
        with reason abort."""
        group = self.groups.get(request_id)
        members = group.members if group else [self.requests.get(request_id)]
        for seq in members:
            if seq is None or seq.is_finished:
                continue
            self.scheduler.remove(seq, keep_cached=False)
            seq.finish_reason = "abort"
            self.aborted.append(seq)
        if group:
            group.n, group.forked = len(group.members), True  # no more samples will be made

    def has_unfinished_requests(self) -> bool:
        """True while any request waits, runs, or has an abort still to report."""
        return self.scheduler.has_unfinished() or bool(self.aborted)

    def num_unfinished_requests(self) -> int:
        """Requests waiting or running."""
        return len(self.scheduler.waiting) + len(self.scheduler.running)

    def admission_capacity(self) -> int:
        """How many new requests are worth reading now: free sequence slots not yet claimed
        by waiting requests, and none while free KV cannot hold what already waits."""
        sched = self.scheduler
        slots = self.args.max_num_seqs - len(sched.running) - len(sched.waiting)
        waiting_tokens = sum(s.num_tokens - s.num_computed_tokens for s in sched.waiting)
        free_tokens = self.block_manager.num_free_blocks * self.block_size
        if waiting_tokens >= free_tokens:
            return 0
        return max(0, slots)

    # -- the step ---------------------------------------------------------------------
    def step(self) -> tuple[list[RequestOutput], StepStats]:
        """Schedule, run the model once, sample, and evict what finished."""
        start = time.time()
        t0 = time.perf_counter()
        waiting_before = len(self.scheduler.waiting)
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running)
        plan = self.scheduler.schedule()
        t1 = time.perf_counter()
        self.runner.copy_blocks(plan.block_copies)  # copy-on-write, before anything writes
        logits = self.runner.execute(plan.scheduled) if not plan.is_empty else None
        t2 = time.perf_counter()
        outputs, num_accepted = self._process(plan, logits, start)
        t3 = time.perf_counter()
        stats = StepStats(
            step=self.step_index,
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_prefill_tokens=plan.num_prefill_tokens,
            num_decode_tokens=plan.num_decode_tokens,
            kv_blocks_used=self.block_manager.num_used_blocks,
            kv_blocks_total=self.block_manager.num_blocks,
            num_preemptions=len(plan.preempted),
            num_admitted=plan.num_admitted,
            num_finished=sum(1 for o in outputs if o.finished),
            schedule_seconds=t1 - t0,
            forward_seconds=t2 - t1,
            sample_seconds=t3 - t2,
            start_time=start,
            num_cached_tokens=plan.num_cached_tokens,
            kv_tokens=sum(s.num_computed_tokens for s in self.scheduler.running),
            num_scheduled_seqs=len(plan.scheduled),
            num_waiting_before=waiting_before,
            num_draft_tokens=plan.num_draft_tokens,
            num_accepted_tokens=num_accepted,
        )
        self.step_index += 1
        self.total_draft_tokens += stats.num_draft_tokens
        self.total_accepted_tokens += num_accepted
        return outputs, stats

    def _process(
        self, plan: SchedulerOutput, logits: torch.Tensor | None, now: float
    ) -> tuple[list[RequestOutput], int]:
        """Sample, append, stop-check and evict; returns the outputs and accepted drafts."""
        outputs = [o for seq in self.aborted if (o := self._finish(seq, now)) is not None]
        self.aborted = []
        sampling = [s for s in plan.scheduled if s.samples]  # before num_computed moves
        for s in plan.scheduled:
            seq = s.seq
            # Drafts count as computed only once accepted (below).
            seq.num_computed_tokens += s.num_new_tokens - s.num_draft_tokens
            if seq.metrics.first_scheduled_time is None:
                seq.metrics.first_scheduled_time = now
                seq.metrics.first_step = self.step_index
            seq.metrics.last_step = self.step_index
            self.block_manager.publish_full_blocks(seq)
        if not sampling:
            return outputs, 0
        assert logits is not None, "a step that samples has logits"
        appends, num_accepted, failures = self._sample(sampling, logits)
        done = time.time()
        for seq, error in failures:  # rows the sampler could not use fail alone
            self.scheduler.remove(seq)
            seq.finish_reason = "abort"
            if (final := self._finish(seq, done, [])) is not None:
                final.error = error
                outputs.append(final)
        for seq, tokens, num_drafted in appends:
            new_tokens: list[int] = []
            finished = False
            for token, logprob in tokens:
                seq.append_token(token, logprob)
                new_tokens.append(token)
                if seq.metrics.first_token_time is None:
                    seq.metrics.first_token_time = done
                if self._check_stop(seq):
                    finished = True
                    break
            if finished:
                self.scheduler.remove(seq)
                final = self._finish(seq, done, new_tokens)
                if final is not None:
                    outputs.append(final)
                continue
            if num_drafted:  # the accepted drafts' K/V were computed in this step
                seq.num_computed_tokens += len(tokens) - 1
                self.block_manager.publish_full_blocks(seq)
            outputs.append(self._output(seq, new_tokens))
        return outputs, num_accepted

    def _sample(
        self, sampling: list[ScheduledSequence], logits: torch.Tensor
    ) -> tuple[list[Append], int, list[tuple[Sequence, str]]]:
        """Tokens to append per sampling sequence: one drawn by the sampler, or the verified
        drafts plus one; forked samples of n > 1 requests draw from their leader's row.
        Also the sequences whose row the sampler refused, with its error."""
        plain_rows: list[int] = []
        draft_rows: list[int] = []
        row = 0
        for s in sampling:
            if s.num_draft_tokens:
                draft_rows.extend(range(row, row + 1 + s.num_draft_tokens))
            else:
                plain_rows.append(row)
            row += 1 + s.num_draft_tokens
        plain = [s for s in sampling if not s.num_draft_tokens]
        appends: list[Append] = []
        failures: list[tuple[Sequence, str]] = []
        if plain:
            rows_logits = logits if not draft_rows else logits[plain_rows]  # [num_plain, vocab]
            drawn = self.sampler.sample(rows_logits, [s.seq for s in plain])
            for i, s in enumerate(plain):
                if drawn.errors[i]:
                    failures.append((s.seq, drawn.errors[i] or ""))
                    continue
                appends.append((s.seq, [(drawn.token_ids[i], drawn.logprobs[i])], 0))
                group = self.groups.get(s.seq.group_id or "")
                if group is not None and not group.forked:
                    for child, token, logprob in self._fork_samples(group, rows_logits[i]):
                        appends.append((child, [(token, logprob)], 0))
        num_accepted = 0
        if draft_rows:
            targets = logits[draft_rows].argmax(dim=-1).tolist()  # [num_draft_rows]
            offset = 0
            for s in sampling:
                if not s.num_draft_tokens:
                    continue
                n = 1 + s.num_draft_tokens
                kept = accept(s.seq.draft_token_ids[: s.num_draft_tokens], targets[offset : offset + n])
                offset += n
                num_accepted += len(kept) - 1
                appends.append((s.seq, [(t, None) for t in kept], s.num_draft_tokens))
                s.seq.draft_token_ids = []
        return appends, num_accepted, failures

    def _check_stop(self, seq: Sequence) -> bool:
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

    def _fork_samples(self, group: SampleGroup, logits_row: torch.Tensor) -> list[tuple[Sequence, int, Any]]:
        """Create samples 1..n-1 of a request whose prompt was just computed: they share its
        blocks by reference count and draw their first token from the same logits."""
        leader = group.members[0]
        group.forked = True
        children = []
        for k in range(1, group.n):
            seed = leader.params.seed
            child = Sequence(
                request_id=f"{leader.request_id}#sample{k}", prompt_token_ids=leader.prompt_token_ids,
                params=leader.params, metrics=RequestMetrics(arrival_time=leader.metrics.arrival_time),
                prompt=leader.prompt, priority=leader.priority, tenant=leader.tenant,
                generator=make_generator(None if seed is None else seed + k, self.device),
                max_tokens=leader.max_tokens, group_id=leader.request_id, sample_index=k,
            )
            child.num_computed_tokens = leader.num_computed_tokens
            child.metrics.first_scheduled_time = leader.metrics.first_scheduled_time
            child.metrics.first_step = leader.metrics.first_step
            child.metrics.last_step = leader.metrics.last_step
            self.block_manager.fork(leader, child)
            self.scheduler.add_running(child)
            self.requests[child.request_id] = child
            group.members.append(child)
            children.append(child)
        batch = logits_row.unsqueeze(0).repeat(len(children), 1)  # [n - 1, vocab]
        drawn = self.sampler.sample(batch, children)
        return list(zip(children, drawn.token_ids, drawn.logprobs, strict=True))

    def _finish(self, seq: Sequence, now: float, new_tokens: list[int] | None = None) -> RequestOutput | None:
        """The final output of a finished sequence; for n > 1, of the whole request once its
        last sample ends (None before that)."""
        seq.status = SequenceStatus.FINISHED
        seq.metrics.finished_time = now
        if seq.text is None:  # a stop string sets it (possibly to ""), else decode now
            seq.text = self.stop_checker.final_text(seq.output_token_ids, seq.params)
        del self.requests[seq.request_id]
        if new_tokens is None:
            new_tokens = seq.output_token_ids[-1:] if seq.finish_reason != "abort" else []
        out = self._output(seq, new_tokens)
        out.finished = True
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

    def _output(self, seq: Sequence, new_tokens: list[int]) -> RequestOutput:
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
        )
