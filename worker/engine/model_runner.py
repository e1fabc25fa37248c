"""The model side of the engine: load the checkpoint, size and own the KV pool, and run
each planned step as one packed batch without padding.

As nano-vllm's ``ModelRunner``: everything that touches weights or KV tensors lives
here; the engine only hands it a plan and gets back logits.
"""

from __future__ import annotations

import logging
import math
import mmap
import time
from collections.abc import Callable

import torch

from kernels import get_backend
from worker.engine.attention_metadata import AttentionMetadata
from worker.engine.block_tables import BlockTables
from worker.engine.config import (
    DEFAULT_CPU_KV_CACHE_BYTES,
    DEFAULT_CPU_KV_CACHE_MIN_TOKENS,
    EngineArgs,
)
from worker.engine.decode_graphs import DecodeGraphs
from worker.engine.models.cpu_linear import pack_linears, packer_for
from worker.engine.models.loader import load_checkpoint
from worker.engine.models.native_stack import build_native_stack
from worker.engine.models.registry import build_model
from worker.engine.models.spec import ArchSpec
from worker.engine.models.weights import load_weights
from worker.engine.step_inputs import StepInputs
from worker.engine.step_plan import SchedulerOutput
from worker.protocol.sampling_params import InvalidRequestError

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def kv_pool_tensor(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, *,
                   committed: bool = False) -> torch.Tensor:
    """A zeroed KV pool: ``committed`` holds all its memory from the start; otherwise (CPU
    only) it is a private anonymous memory map, which the kernel fills with zero pages as
    they are first written, so the pool holds only the memory of the blocks handed out so
    far (the block manager then hands out never-used blocks last).

    The map asks for transparent huge pages (``MADV_HUGEPAGE``; honoured where the kernel's
    THP mode is ``madvise`` or ``always``): decode attention reads blocks scattered over the
    pool, and with 4 KB pages every 12 KB block costs page walks whose tables the step's
    weight stream has evicted. 30 layers of SmolLM2's decode attention over randomly placed
    blocks took 0.93x and 0.91x the time of a shared map at 8 sequences and 0.96x and 0.97x
    at 64 (``benchmarks/kv_pool_pages.py``, docs/kernels.md). The pool then commits memory
    2 MB at a time per layer's K or V, so it may hold up to 2 MB more per layer and cache
    than its written blocks."""
    if committed:
        return torch.zeros(shape, dtype=dtype, device=device)
    if device.type != "cpu":
        raise ValueError(f"only a CPU KV pool can be committed lazily, not one on {device}")
    numel = math.prod(shape)
    # Python's default for an anonymous map is MAP_SHARED (shared memory, no huge pages,
    # shared with a forked child); the pool is this process's own.
    region = mmap.mmap(-1, max(1, numel * dtype.itemsize), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):  # Linux only
        region.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(region, dtype=dtype, count=numel).view(shape)  # keeps region alive


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when available, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device, declared: torch.dtype | None = None) -> torch.dtype:
    """``auto`` is the checkpoint's declared dtype (fp32 when it declares none or a dtype
    torch cannot run), except where that reduced precision would run slower than fp32 on
    this CPU (:func:`slow_reduced_precision`): fp32 there. CUDA runs an fp32 checkpoint in
    bf16 (fp32 matmuls leave the tensor cores idle)."""
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cuda":
        return declared if declared in (torch.bfloat16, torch.float16) else torch.bfloat16
    if declared in (torch.bfloat16, torch.float16) and slow_reduced_precision(declared, device) is None:
        return declared
    return torch.float32


def slow_reduced_precision(dtype: torch.dtype, device: torch.device) -> str | None:
    """Why ``dtype`` will run slower than fp32 on this CPU, or None. Without bf16 (or fp16)
    instructions oneDNN converts every operand to fp32 and back: on an Intel Xeon with
    AVX-512 but no avx512_bf16, bf16 ran at 0.37x fp32 on the chat workload, where an AMD
    EPYC with avx512_bf16 ran it at 1.36x (docs/benchmarks.md)."""
    if device.type != "cpu" or dtype == torch.float32:
        return None
    if dtype == torch.bfloat16:
        native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
        needed = "avx512_bf16 or AMX"
    else:
        native = torch.cpu._is_amx_fp16_supported()
        needed = "AMX-FP16"
    if native:
        return None
    return (f"dtype {str(dtype).removeprefix('torch.')}: this CPU has no {needed} instructions, so "
            "reduced precision runs slower than float32 here (oneDNN converts each operand); "
            "use float32 for speed")


def kv_bytes_per_token(spec: ArchSpec, dtype: torch.dtype) -> int:
    """Bytes of K and V, all layers, for one token."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * itemsize


def eos_token_ids(config, tokenizer) -> set[int]:
    """End-of-sequence ids from the model config and the tokenizer together."""
    ids: set[int] = set()
    for source in (config.eos_token_id, tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(source)
    return ids


class ModelRunner:
    """Owns the model and the KV pool; builds each step's tensors and runs the forward."""

    def __init__(self, args: EngineArgs) -> None:
        """Load ``args.model``, prepack its weights (CPU, when oneDNN is there), size the
        KV pool from ``args`` and the free memory, and capture decode graphs (CUDA)."""
        started = time.perf_counter()
        self.device = device = resolve_device(args.device)
        if args.num_threads and device.type == "cpu":
            torch.set_num_threads(args.num_threads)
        checkpoint = load_checkpoint(args.model)
        self.tokenizer = checkpoint.tokenizer
        self.config = config = checkpoint.config
        self.dtype = resolve_dtype(args.dtype, device, checkpoint.torch_dtype)
        slow = slow_reduced_precision(self.dtype, device)
        if slow:
            log.warning(slow)
        self.max_model_len = min(args.max_model_len or config.max_position_embeddings,
                                 config.max_position_embeddings)
        model = build_model(config, self.max_model_len, device, self.dtype)
        self.spec = model.spec
        load_weights(model, checkpoint.tensors())
        del checkpoint
        self.model = model
        self.load_seconds = time.perf_counter() - started
        log.info("loaded %s (%s, %s) in %.2fs", args.model, self.spec.family,
                 str(self.dtype).removeprefix("torch."), self.load_seconds)
        self.prepacked = False
        if device.type == "cpu" and args.prepack_weights is not False:
            pack = packer_for(self.dtype)
            if pack is not None:
                self.prepacked = pack_linears(model, pack) > 0
            elif args.prepack_weights:
                raise InvalidRequestError(
                    f"prepack_weights=True needs packed CPU linears for {self.dtype}: the "
                    "native fp32 kernel or oneDNN (this torch build or this CPU has neither)")
        self.eos_token_ids = eos_token_ids(config, self.tokenizer)
        self.block_size = args.block_size
        self.num_blocks = self._num_kv_blocks(args)
        self.backend = get_backend(device, args.attention_backend)
        shape = (self.num_blocks, args.block_size, self.spec.num_kv_heads, self.spec.head_dim)
        # One tensor per K/V for all layers: [num_layers, num_blocks, block_size, Hkv, D]
        self.kv_pool_committed = device.type != "cpu" or args.commit_kv_pool
        self.k_pool = kv_pool_tensor((config.num_hidden_layers, *shape), self.dtype, device,
                                     committed=self.kv_pool_committed)
        self.v_pool = kv_pool_tensor((config.num_hidden_layers, *shape), self.dtype, device,
                                     committed=self.kv_pool_committed)
        self.kv_caches = [(self.k_pool[i], self.v_pool[i]) for i in range(config.num_hidden_layers)]
        model.native_stack = build_native_stack(model, self.kv_caches)  # None where it does not cover
        self.block_tables = BlockTables()  # the block manager keeps it current
        self.step_inputs = StepInputs(device, args.block_size, self.block_tables)
        use_graphs = args.decode_graphs if args.decode_graphs is not None else device.type == "cuda"
        self.decode_graphs: DecodeGraphs | None = None
        if use_graphs:
            self.decode_graphs = DecodeGraphs(
                model=model, kv_caches=self.kv_caches, backend=self.backend, device=device,
                max_batch=args.max_num_seqs, max_blocks_per_seq=-(-self.max_model_len // args.block_size),
            )
            self.decode_graphs.capture()

    def _num_kv_blocks(self, args: EngineArgs) -> int:
        """Blocks for the pool: ``num_kv_blocks``, else ``kv_cache_memory`` bytes, else 80%
        of free GPU memory (CUDA) or DEFAULT_CPU_KV_CACHE_BYTES, and at least
        DEFAULT_CPU_KV_CACHE_MIN_TOKENS tokens (CPU)."""
        if args.num_kv_blocks is not None:
            return args.num_kv_blocks
        per_token = kv_bytes_per_token(self.spec, self.dtype)
        budget = args.kv_cache_memory
        if budget is None:
            if self.device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(self.device)
                budget = int(free * 0.8)
            else:
                budget = max(DEFAULT_CPU_KV_CACHE_BYTES, DEFAULT_CPU_KV_CACHE_MIN_TOKENS * per_token)
        per_block = per_token * args.block_size
        if budget < per_block:
            raise InvalidRequestError(f"kv_cache_memory={budget} bytes is smaller than one block ({per_block})")
        return budget // per_block

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to this, exclusive."""
        return int(self.config.vocab_size)

    def build_inputs(self, plan: SchedulerOutput) -> tuple[torch.Tensor, AttentionMetadata]:
        """Packed ``input_ids`` and the AttentionMetadata of a step (decodes first)."""
        return self.step_inputs.build(plan)

    @torch.inference_mode()
    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks, all layers (copy-on-write of shared partial blocks)."""
        if not copies:
            return
        src = torch.tensor([s for s, _ in copies], device=self.device)
        dst = torch.tensor([d for _, d in copies], device=self.device)
        self.k_pool[:, dst] = self.k_pool[:, src]  # [num_layers, num_copies, bs, Hkv, D]
        self.v_pool[:, dst] = self.v_pool[:, src]

    @torch.inference_mode()
    def execute(self, plan: SchedulerOutput,
                between_layers: Callable[[], None] | None = None) -> torch.Tensor:
        """Run one step; logits ``[num_rows, vocab]`` in the order of ``plan.logits_rows``.
        ``between_layers``: called after every layer but the last (see
        ``PackedCausalLM.forward``); a step run as a captured graph calls it never."""
        input_ids, meta = self.build_inputs(plan)
        graphs = self.decode_graphs
        if (graphs is not None and meta.num_decode_seqs == meta.num_seqs
                and graphs.fits(meta.num_seqs, meta.block_tables.shape[1])):
            logits = graphs.run(input_ids, meta)  # [num_seqs, vocab]: a row per sequence
            rows = plan.logits_rows.token_indices  # one query per sequence: token = sequence
            return logits if len(rows) == meta.num_seqs else logits[rows]
        return self.model(input_ids, meta, self.kv_caches, self.backend, between_layers)
