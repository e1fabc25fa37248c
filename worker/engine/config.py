"""Engine arguments: one validated dataclass, shared by LLM, the CLI and the worker."""

from __future__ import annotations

from dataclasses import dataclass

from worker.protocol.sampling_params import InvalidRequestError

SERVICE_CLASSES = ("interactive", "batch")
POLICIES = ("fcfs", "static", "static-padded", "priority", "sjf", "fair")
FAIR_SHARES = ("tokens", "engine_seconds")  # what the fair policy's ledger counts
DEFAULT_CPU_KV_CACHE_BYTES = 1 << 30  # 1 GiB: about 23k tokens of SmolLM2-135M in fp32
# ...but never fewer tokens than this: a model with wider KV per token (Qwen3-0.6B: 224 KiB
# in fp32, 4.7k tokens in 1 GiB) would otherwise preempt all the time. The CPU pool is only
# reserved, so the bytes beyond what is in use cost no memory.
DEFAULT_CPU_KV_CACHE_MIN_TOKENS = 16384


@dataclass
class EngineArgs:
    """Everything that shapes an engine; ``None`` means "derive from the model/device"."""

    model: str = "smollm2-135m"
    dtype: str = "auto"  # auto: float32 on CPU, bfloat16 on CUDA
    device: str = "auto"  # auto: cuda when available, else cpu
    block_size: int = 16
    num_kv_blocks: int | None = None  # overrides kv_cache_memory
    kv_cache_memory: int | None = None  # bytes for K and V of all layers
    max_num_seqs: int = 256  # sequences per step (vLLM's default for offline CPU runs too)
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    policy: str = "fcfs"
    enable_prefix_caching: bool = True  # shared prompt prefixes (system prompts) computed once
    # CPU: commit the whole KV pool at start, so freed prefix blocks stay cached until the
    # pool is full (the process then holds the whole pool). False: the pool's memory follows
    # the peak blocks in use and freed blocks are reused first. Always committed on CUDA.
    commit_kv_pool: bool = False
    enable_chunked_prefill: bool = True
    tenant_weights: dict[str, float] | None = None  # fair policy: share of what is served
    # fair policy: what a tenant is served, "tokens" computed or "engine_seconds" (each
    # step's wall time split by rows, worker.engine.step_cost)
    fair_share: str = "tokens"
    attention_backend: str | None = None  # "torch" | "cpu" | "triton"; None picks by device
    decode_graphs: bool | None = None  # CUDA graphs for decode steps; None: on with CUDA
    seed: int = 0
    num_threads: int | None = None  # torch intra-op threads on CPU
    prepack_weights: bool | None = None  # oneDNN-prepacked linears on CPU; None: when available
    num_speculative_tokens: int = 0  # n-gram drafts per greedy sequence per step; 0 = off
    speculative_max_rows: int = 128  # decode rows + drafts per step, beyond which no drafts
    swap_space: int = 0  # bytes of host memory for preempted KV; 0: preempt by recompute only
    swap_min_tokens: int = 256  # swap contexts at least this long, recompute shorter ones
    # Interactive vs batch requests (add_request's service_class; docs/design.md): batch
    # admission leaves this many sequence slots and step tokens free (capped at
    # a quarter of max_num_seqs and of max_num_batched_tokens)...
    interactive_reserve_seqs: int = 4
    interactive_reserve_tokens: int = 256
    # ...and waiting interactive requests are admitted before batch ones, preempting the
    # lowest-value batch sequence when slots or KV blocks are full.
    interactive_priority: bool = True
    # While interactive requests run or wait, a step computes only as many rows of batch
    # work as fit in about this many milliseconds (the engine's own recent steps tell how
    # many: worker.engine.step_time_model), the running batch sequences taking turns so
    # each still advances every few steps (0, the default: no time target). It paces an
    # interactive stream (a token a step) at the batch's cost: on two CPU cores 100 ms is
    # about 25 rows of SmolLM2 and the batch kept 72% of its tokens/s against 97% with
    # none; an arrival's first token needs no short steps (interactive_interject_ms). On a
    # GPU, where a step costs about the same whatever its rows, it bounds nothing
    # (docs/benchmarks.md, "step budget", "interjected steps")...
    interactive_step_ms: float = 0.0
    # ...and at most this many batch rows, whatever the time (0: no fixed cap).
    interactive_batch_rows: int = 0
    # A step that would admit a newly arrived interactive request computes no batch rows at
    # all (never two such steps in a row, so arrivals cannot stop the batch): the arrival's
    # prompt waits on a step of interactive work only, not on a capped batch step (needs
    # interactive_priority; docs/benchmarks.md, "fast lane").
    interactive_fast_lane: bool = True
    # A step expected to take longer than this many milliseconds (the step-time model's
    # estimate) pauses between every two layers when the service loop has interactive
    # arrivals, and runs a step of their prompts alone there (LLMEngine.interjected_step):
    # an arrival waits for a layer of a wide batch step, not for the whole step (needs
    # interactive_priority; 0: never; docs/benchmarks.md, "interjected steps").
    interactive_interject_ms: float = 100.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise InvalidRequestError on values no engine can run with."""
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise InvalidRequestError(f"block_size={self.block_size}: must be a power of two")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise InvalidRequestError(f"num_kv_blocks={self.num_kv_blocks}: must be >= 1")
        if self.kv_cache_memory is not None and self.kv_cache_memory < 1:
            raise InvalidRequestError(f"kv_cache_memory={self.kv_cache_memory}: must be > 0 bytes")
        if self.num_speculative_tokens < 0 or self.speculative_max_rows < 1:
            raise InvalidRequestError(
                "num_speculative_tokens must be >= 0 and speculative_max_rows >= 1"
            )
        if self.swap_space < 0 or self.swap_min_tokens < 1:
            raise InvalidRequestError("swap_space must be >= 0 bytes and swap_min_tokens >= 1")
        if (self.interactive_reserve_seqs < 0 or self.interactive_reserve_tokens < 0
                or self.interactive_batch_rows < 0 or not self.interactive_step_ms >= 0
                or not self.interactive_interject_ms >= 0):
            raise InvalidRequestError("interactive_reserve_seqs, interactive_reserve_tokens, "
                                      "interactive_batch_rows, interactive_step_ms and "
                                      "interactive_interject_ms must be >= 0")
        if self.max_num_seqs < 1:
            raise InvalidRequestError(f"max_num_seqs={self.max_num_seqs}: must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise InvalidRequestError(
                f"max_num_batched_tokens={self.max_num_batched_tokens}: must be >= 1"
            )
        if self.max_model_len is not None and self.max_model_len < 2:
            raise InvalidRequestError(f"max_model_len={self.max_model_len}: must be >= 2")
        if self.fair_share not in FAIR_SHARES:
            raise InvalidRequestError(
                f"fair_share={self.fair_share!r}: expected one of {FAIR_SHARES}")
        if self.policy not in POLICIES:
            raise InvalidRequestError(f"policy={self.policy!r}: expected one of {POLICIES}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise InvalidRequestError(
                f"dtype={self.dtype!r}: expected auto, float32, bfloat16 or float16"
            )
