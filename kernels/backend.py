"""Choose the attention implementation for a device."""

from __future__ import annotations

import warnings

import torch

from kernels.attention_backend import TORCH_BACKEND, AttentionBackend


def get_backend(device: torch.device | str, prefer: str | None = None) -> AttentionBackend:
    """The backend for ``device``; ``prefer`` ("torch", "cpu", "triton") forces one.

    By default CUDA gets Triton and the CPU gets the native C++ kernel; either falls back
    to pure torch when it cannot be imported or built (a warning says so).
    """
    device = torch.device(device)
    want = prefer or ("triton" if device.type == "cuda" else "cpu")
    if want == "torch":
        return TORCH_BACKEND
    if want == "triton":
        try:
            from kernels.triton_backend import TRITON_BACKEND
        except ImportError as exc:  # no triton build, or kernels not shipped yet
            if prefer == "triton":
                raise RuntimeError(f"the Triton backend is unavailable: {exc}") from exc
            return TORCH_BACKEND
        return TRITON_BACKEND
    if want == "cpu":
        if device.type != "cpu":
            raise ValueError(f"the 'cpu' attention backend cannot run on {device}")
        from kernels import cpu_native

        try:
            return cpu_native.make_backend()
        except Exception as exc:  # no compiler or ninja: slower but correct
            if prefer == "cpu":
                raise RuntimeError(f"the native CPU backend does not build here: {exc}") from exc
            warnings.warn(f"native CPU attention unavailable, using pure torch: {exc}", stacklevel=2)
            return TORCH_BACKEND
    raise ValueError(f"unknown attention backend {want!r}; expected 'torch', 'cpu' or 'triton'")
