"""Paged-attention kernels behind one interface; the implementation is picked by device.

Callers use :func:`get_backend` once with the engine's device and call the returned
backend's ``write_kv``, ``decode_attention`` and ``prefill_attention``; nothing above
this package knows whether Triton or pure torch runs underneath.
"""

from kernels.attention_backend import AttentionBackend
from kernels.backend import get_backend

__all__ = ["AttentionBackend", "get_backend"]
