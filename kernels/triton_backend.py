"""The Triton implementation of the paged-attention backend (CUDA; CPU under TRITON_INTERPRET).

Importing this module imports triton and decorates the kernels; :func:`kernels.get_backend`
imports it only when Triton is wanted, so a CPU-only install without triton still works.
Both attention kernels take the interface's sliding ``window`` and logit ``softcap`` as
compile-time constants, so a layer without them runs the same code as before they existed.
"""

from __future__ import annotations

from kernels.attention_backend import AttentionBackend
from kernels.triton_decode_attention import decode_attention
from kernels.triton_prefill_attention import prefill_attention
from kernels.triton_write_kv import write_kv

TRITON_BACKEND = AttentionBackend(
    name="triton",
    write_kv=write_kv,
    decode_attention=decode_attention,
    prefill_attention=prefill_attention,
)
