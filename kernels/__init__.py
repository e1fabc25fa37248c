"""Paged-attention kernels behind one interface; the implementation is picked by device.

Callers use :func:`get_backend` once with the engine's device and call the returned
backend's ``write_kv``, ``decode_attention`` and ``prefill_attention``; nothing above
this package knows whether Triton or pure torch runs underneath.

Hugging Face's ``kernels`` distribution has the same import name as this package;
transformers imports it (``from kernels import ...``) wherever it is installed, which
transformers 5.25 and later require. Asked for a name of that package, this one says so.
"""

import importlib.metadata
import importlib.util

from kernels.attention_backend import AttentionBackend
from kernels.backend import get_backend

__all__ = ["AttentionBackend", "get_backend"]


def __getattr__(name: str) -> object:
    """A name this package lacks. Where Hugging Face's ``kernels`` is installed, an
    ImportError that names the clash (``from kernels import X`` keeps its message); else
    the usual AttributeError, which also lets the import system load a submodule."""
    if name.startswith("__") or importlib.util.find_spec(f"{__name__}.{name}") is not None:
        raise AttributeError(name)
    try:
        clashing = importlib.metadata.version("kernels")
    except importlib.metadata.PackageNotFoundError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    raise ImportError(
        f"cannot import {name!r} from inflight's 'kernels' package: Hugging Face's 'kernels' "
        f"{clashing} is installed too and shares its import name (transformers imports it). "
        "inflight needs transformers<5.25 without it: pip uninstall kernels && "
        "pip install 'transformers<5.25'"
    )
